"""GPU checks of a sliding window inside the ring (marker `gpu`, run on the GPU machine):

python -m pytest -m gpu tests/gpu/test_gpu_window.py -q -s

A thread ring (tests/thread_ring.py) on one GPU runs a windowed call's forward and backward in
bf16 through the training loops: blocks the window leaves alone on the call's own kernel (cuDNN,
torch flash), banded blocks on the kernel `window_pair` picks (torch's flash op with its window
arguments where the bands probe passes, else the exact masked one). Then a ring of processes on
the same GPU over the IPC transport runs the public call (`token_ring_attn(window_size=)`).

Both are compared with fp64 attention of the whole sequence under the window's mask: out, dq,
dk and dv each within 1.15x of the error of the same ring summing in fp64 (`BlockCall.acc`:
the same blocks, kernels and transfers, so what is measured is what the ring's own sums add),
plus the small floor test_gpu_kv_both_ways.py uses. The whole sequence in one block (ring of
one) is printed next to them and bounded loosely, as there. The IPC ring's kernels and messages
are counted against the window plan.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from tests.harness import run_ranks, values
from tests.window_ring import reference, window_case
from tokenring_xdit.ring.kernels import PAIRS, window_pair

pytestmark = pytest.mark.gpu

BF16_TOL = {"out": 2e-2, "dq": 6e-2, "dk": 6e-2, "dv": 6e-2}
RATIO = 1.15
# As test_gpu_kv_both_ways.py: errors are relative to max(|ref|, 1), and near one bf16 ulp at
# that size (2^-8) a single final rounding landing either way is most of either error, so a
# 1.15x ratio of two such errors would measure where one element rounds, not what the sums add.
FLOOR = 4e-3
# One block of the whole sequence rounds each gradient once; a ring of N sums N rounded block
# gradients, so its max error reaches ~1.8x that block's (TokenRing and the K/V family alike).
WHOLE = 2.5


@pytest.fixture(scope="module", autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.fail("the gpu marker needs CUDA")


def _failures(tag: str, ring: dict, own: dict, whole: dict | None) -> list[str]:
    """Per tensor: within 1.15x of the same ring's error with fp64 sums (or the floor), within
    the absolute bf16 tolerance, and loosely within the whole sequence's error (if given)."""
    failures = []
    for what, err in ring.items():
        bound = max(RATIO * own[what], FLOOR)
        line = f"{tag} {what}: ring {err:.2e}, its blocks' own {own[what]:.2e}"
        print(line + ("" if whole is None else f", whole sequence {whole[what]:.2e}"))
        if not err <= bound:
            failures.append(f"{tag} {what}: {err:.3g} > {bound:.3g} (own {own[what]:.3g})")
        if not err <= BF16_TOL[what]:
            failures.append(f"{tag} {what}: {err:.3g} > {BF16_TOL[what]}")
        if whole is not None and not err <= WHOLE * whole[what] + FLOOR:
            failures.append(f"{tag} {what}: {err:.3g} vs whole sequence {whole[what]:.3g}")
    return failures


# (ring, causal, split, local length, window): inside a shard, over shards, GQA, documents
CASES = [
    (4, True, "zigzag", 1024, (127, 0), None),
    (4, True, "contiguous", 1024, (127, 0), None),
    (4, True, "contiguous", 1024, (1500, 0), None),
    (3, False, "zigzag", 768, (200, 100), None),
    (2, True, "zigzag", 1024, (255, 0), (0, 300, 1100, 2048)),
    (4, True, "documents", 1024, (255, 0), (0, 300, 1100, 2048, 3000, 4096)),
]


@pytest.mark.parametrize("kernel", ["cudnn", "torch_flash"])
@pytest.mark.parametrize("n, causal, split, local, window, bounds", CASES)
def test_window_ring_bf16_within_the_kernels_own_error(kernel, n, causal, split, local, window,
                                                       bounds):  # fmt: skip
    dense = PAIRS[kernel]
    pair = window_pair(dense, torch.device("cuda"), torch.bfloat16, 64, 64)
    print(f"\n{kernel}: bands by {pair.forward.band.name}")
    args = dict(bounds=bounds, b=2, h=8, h_kv=2, d=64, dtype=torch.bfloat16, pair=dense,
                device="cuda")  # fmt: skip
    ring, counts, _ = window_case(n, causal, split, local, window, **args)
    own, own_counts, _ = window_case(n, causal, split, local, window, acc=torch.float64, **args)
    whole, _, _ = window_case(1, causal, split, n * local, window, **args)
    print(f"ring {n} {split} window {window}: counts {counts}")
    assert own_counts == counts  # the same blocks and transfers, only the sums differ
    failures = _failures(f"ring {n} {split} {window}", ring, own, whole)
    assert not failures, "\n".join(failures)


# Processes sharing one GPU over the IPC transport, causal, bf16: (name, ring, split, local
# length, window). 128 keys per query inside zigzag chunks; contiguous shards whose first 700
# rows reach into the previous shard (the plan carries only those rows).
IPC_CASES = [
    ("zigzag-4-w128", 4, "zigzag", 1024, (127, 0)),
    ("contiguous-2-over-shards", 2, "contiguous", 1024, (700, 0)),
]
IPC_SHAPE = dict(b=2, h=8, h_kv=2, d=64)  # GQA 8/2


def ipc_split(n: int, split: str, total: int):
    """The case's split; a causal contiguous one is a packed row of one document (make_split
    cuts causal contiguous shards of packed rows only)."""
    from tokenring_xdit import make_split

    cu = [0, total] if split == "contiguous" else None
    return make_split(total, n, causal=True, cu_seqlens=cu, layout=split)


def _traffic() -> dict:
    from tokenring_xdit.ring.comm import COUNTERS

    got = dict(kernels=COUNTERS.kernel_calls, q=COUNTERS.q_messages,
               partial=COUNTERS.partial_messages)  # fmt: skip
    COUNTERS.reset()
    return got


def _attend(loc, split, window, acc):
    """(out, lse) of this rank's windowed call: the public call, or (acc) the same prepared call
    with its sums in `acc` (`BlockCall.acc`, as the K/V test builds its KvCall), through the
    same autograd seam."""
    from tokenring_xdit import token_ring_attn
    from tokenring_xdit.ring.seam.prepare import CallOptions, prepare
    from tokenring_xdit.ring.seam.run import train_attn

    # TokenRing's plan (auto would move K/V under GQA on CUDA: tests/gpu/test_gpu_kv_both_ways.py)
    options = dict(causal=True, split=split, window_size=window, cuda_graph=False, travel="q")
    if acc is None:  # (eager: a capture would count its posts again)
        return token_ring_attn(*loc, **options)
    prepared = prepare(*loc, CallOptions(**options))
    assert prepared.train, "a windowed call with gradients runs the block path"
    call = dataclasses.replace(prepared.call, acc=acc)
    return train_attn(*loc, prepared._replace(call=call))


def ipc_window_worker(rank: int, n: int, case: tuple, device: str, shape: dict) -> dict:
    """Per run (the public call; its sums in fp64): this rank's max |err| of out, dq, dk, dv
    against fp64 attention of the whole sequence, the largest |reference| of its shard, and
    the kernels and messages it ran per pass. `device` cpu: the same on gloo lanes."""
    import torch.distributed as dist

    from tokenring_xdit import shard
    from tokenring_xdit.ring.comm import setup_token_ring_group

    if device == "cuda":
        torch.cuda.set_device(0)
    setup_token_ring_group(dist.group.WORLD)
    _, _, split_name, local, window = case
    b, h, h_kv, d = (shape[x] for x in ("b", "h", "h_kv", "d"))
    total = n * local
    gen = torch.Generator().manual_seed(31 + n)
    full = [torch.randn(b, hh, total, d, generator=gen, dtype=torch.float64).bfloat16().to(device)
            for hh in (h, h_kv, h_kv, h)]  # fmt: skip
    split = ipc_split(n, split_name, total)

    def local_of(x):  # (b, h, S, d) -> this rank's (b, s, h, d)
        return shard(x.transpose(1, 2), split=split).contiguous()

    names = ("out", "dq", "dk", "dv")
    refs = [local_of(x) for x in reference(*full, window, True)]
    result = {"ref_max": {w: r.abs().max().item() for w, r in zip(names, refs, strict=True)}}
    for label, acc in (("ring", None), ("own", torch.float64)):
        loc = [local_of(x).requires_grad_() for x in full[:3]]
        _traffic()
        out, _ = _attend(loc, split, window, acc)
        fwd = _traffic()
        out.backward(local_of(full[3]))
        bwd = _traffic()
        got = [out.detach(), *(x.grad for x in loc)]
        errs = {w: (g.double() - r).abs().max().item()
                for w, g, r in zip(names, got, refs, strict=True)}  # fmt: skip
        result[label] = dict(errs=errs, fwd=fwd, bwd=bwd, dtype_ok=out.dtype == torch.bfloat16)
    if device == "cuda":
        torch.cuda.synchronize()
    return result


def planned_traffic(n: int, case: tuple, local: int) -> dict:
    """What the window plan of the case runs: kernels per rank per pass, and the messages of
    each pass summed over the ranks (a message is one tensor posted: Q alone forward, Q, dO,
    lse and delta backward; (out, lse) home forward, dQ backward)."""
    from tokenring_xdit.ring.packed.window_plan import window_plan
    from tokenring_xdit.ring.packed.window_traffic import plan_traffic
    from tokenring_xdit.ring.schedules.window import Window

    _, _, split_name, _, window = case
    split, lens = ipc_split(n, split_name, n * local), (local,) * n
    plan = window_plan(Window.of(window, True), True, lens, split.layout(True, n), split.docs)
    kernels = [sum(bool(st.kernel) and plan.block(r, st.step) != () for st in plan.steps[r])
               for r in range(n)]  # fmt: skip
    steps = plan_traffic(plan, lens)
    q_posts, ret_posts = sum(s.q_posts for s in steps), sum(s.ret_posts for s in steps)
    return dict(kernels=kernels, fwd=dict(q=q_posts, partial=2 * ret_posts),
                bwd=dict(q=4 * q_posts, partial=ret_posts))  # fmt: skip


def relative(results: list[dict], label: str) -> dict:
    """Max |err| over the ranks, relative to max(|ref|, 1) over the ranks (as window_case)."""
    return {w: max(r[label]["errs"][w] for r in results)
            / max(max(r["ref_max"][w] for r in results), 1.0)
            for w in ("out", "dq", "dk", "dv")}  # fmt: skip


@functools.cache
def _ipc_launch(case: tuple) -> list[dict]:
    env = {"TOKENRING_XDIT_TRANSPORT": "ipc"}
    return values(run_ranks(ipc_window_worker, case[1], case, "cuda", IPC_SHAPE, timeout=420,
                            env=env))  # fmt: skip


@pytest.mark.parametrize("case", IPC_CASES, ids=[c[0] for c in IPC_CASES])
def test_ipc_window_ring_bf16_within_the_kernels_own_error(case):
    results = _ipc_launch(case)
    ring, own = relative(results, "ring"), relative(results, "own")
    failures = _failures(f"ipc {case[0]}", ring, own, None)
    failures += [f"rank {r}: out not bf16" for r, res in enumerate(results)
                 if not res["ring"]["dtype_ok"]]  # fmt: skip
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("case", IPC_CASES, ids=[c[0] for c in IPC_CASES])
def test_ipc_window_ring_runs_the_kernels_and_messages_of_its_plan(case):
    results, n, local = _ipc_launch(case), case[1], case[3]
    want = planned_traffic(n, case, local)
    for label in ("ring", "own"):
        got = [(r[label]["fwd"]["kernels"], r[label]["bwd"]["kernels"]) for r in results]
        print(f"ipc {case[0]} {label}: kernels per rank {got}, planned {want['kernels']}")
        assert got == [(k, k) for k in want["kernels"]], (label, got, want)
        for half in ("fwd", "bwd"):
            summed = {m: sum(r[label][half][m] for r in results) for m in ("q", "partial")}
            assert summed == want[half], (label, half, summed, want[half])
