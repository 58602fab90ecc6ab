"""TokenRing with several ranks on ONE GPU through the IPC transport (marker `gpu`):

python -m pytest -m gpu tests/gpu/test_gpu_ipc_ring.py -q -s -rA

Ranks are processes with a gloo world group (the input check runs there) and CUDA tensors on
cuda:0; TOKENRING_XDIT_TRANSPORT=ipc moves the data. One launch per ring size runs every case and
returns max |err| against float64 exact attention over the whole sequence:
- inference (token_ring_attn, no grad): bf16 cuDNN / fp32, uneven lengths, KV cache (local K/V
  longer than local Q), joint tokens front and rear, final_chunks > 1;
- training (token_ring_attn_func): causal zigzag and non-causal, out, lse, dq, dk, dv;
- message counters of every case equal those of the same case on the torch.distributed lanes
  (the same ranks, CPU tensors: the code path NCCL runs);
- yunchang's ring-only LongContextAttention;
- CUDA graphs: a call captured over ipc and replayed (flag writes/waits inside the graph).
bf16 errors are compared with the same kernel's own error in one process (its bf16 error).
A peer that raises or dies mid-call is checked in test_gpu_ipc.py (lanes) and here (a call).
"""

from __future__ import annotations

import functools
import os
import time

import pytest
import torch

from tests.distributed.test_training import _case, _shards
from tests.harness import run_ranks, values
from tokenring_xdit.tools.launch import launch_outcomes

pytestmark = pytest.mark.gpu

FP32_TOL = 2e-5
# floors for bf16 (inputs O(1)); the bound is max(2 x the kernel's own error, floor)
BF16_FLOOR = {"out": 2e-2, "lse": 1e-2, "dq": 6e-2, "dk": 6e-2, "dv": 6e-2}
GROUP_TIMEOUT_S = 6


def _infer(name, *, dtype, layout="bshd", d=64, h=4, b=1, lens, kv_lens=None, joint=None,
           chunks=1, seed=0):  # fmt: skip
    return dict(name=name, dtype=dtype, layout=layout, d=d, h=h, b=b, lens=lens,
                kv_lens=kv_lens, joint=joint, chunks=chunks, seed=seed)  # fmt: skip


INFER = [
    _infer("bf16-cudnn-bshd-d128-uneven-kvcache-joint-rear", dtype="bfloat16", d=128,
           lens=[300, 257, 411, 128], kv_lens=[512, 300, 260, 700], joint=("rear", 77), seed=1),
    _infer("bf16-cudnn-bhsd-d64-even-fc2", dtype="bfloat16", layout="bhsd", lens=[256] * 4,
           chunks=2, seed=2),
    _infer("fp32-bshd-d64-uneven-joint-front", dtype="float32", lens=[96, 33, 70, 64],
           kv_lens=[40, 128, 64, 90], joint=("front", 13), seed=3),
]  # fmt: skip
TRAIN = [
    _case("bf16-causal-bshd-d128", causal=True, h=4, d=128, dtype="bfloat16", lens=128, seed=11),
    _case("fp32-causal-bshd-d64", causal=True, h=2, d=64, lens=48, seed=12),
    _case("bf16-noncausal-bhsd-d128-uneven", causal=False, h=4, d=128, layout="bhsd",
          dtype="bfloat16", lens=[200, 136, 256, 64], kv_lens=[300, 136, 100, 250], seed=13),
    _case("fp32-noncausal-bshd-d64", causal=False, h=2, d=64, lens=[64, 80, 48, 96], seed=14),
]  # fmt: skip


def _counters():
    from tokenring_xdit.ring.comm import COUNTERS

    got = dict(COUNTERS.__dict__, by_peer=dict(COUNTERS.by_peer))
    got.pop("handshakes", None)  # the input check's exchanges, not P2P messages
    COUNTERS.reset()
    return got


def _transport(name: str) -> None:
    os.environ["TOKENRING_XDIT_TRANSPORT"] = name  # config.current() re-reads it


def _infer_case(case, rank, n, device):
    """(errors, counters) of one inference case on `device` (cuda: ipc; cpu: gloo lanes)."""
    from tokenring_xdit.ring import token_ring_attn

    gen = torch.Generator().manual_seed(900 + case["seed"])
    b, h, d = case["b"], case["h"], case["d"]
    lens = case["lens"][:n]
    kv_lens = (case["kv_lens"] or case["lens"])[:n]
    dtype = getattr(torch, case["dtype"])
    q = torch.randn(b, h, sum(lens), d, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(b, h, sum(kv_lens), d, generator=gen, dtype=torch.float64) for _ in "kv")
    joint = None
    if case["joint"]:
        joint = [torch.randn(b, h, case["joint"][1], d, generator=gen, dtype=torch.float64)
                 for _ in "kv"]  # fmt: skip
    q, k, v = (x.to(dtype).double() for x in (q, k, v))
    joint = [x.to(dtype).double() for x in joint] if joint else None
    keys = torch.cat([k, joint[0]], 2) if joint else k
    vals = torch.cat([v, joint[1]], 2) if joint else v
    scale = d**-0.5
    scores = (q @ keys.transpose(-1, -2)) * scale
    ref_lse = torch.logsumexp(scores, -1)
    ref_out = torch.softmax(scores, -1) @ vals
    q0, k0 = sum(lens[:rank]), sum(kv_lens[:rank])
    mine_q, mine_kv = slice(q0, q0 + lens[rank]), slice(k0, k0 + kv_lens[rank])
    bshd = case["layout"] == "bshd"

    def local(x, sl):
        x = x[:, :, sl]
        return (x.transpose(1, 2) if bshd else x).to(dtype).contiguous().to(device)

    ql, kl, vl = local(q, mine_q), local(k, mine_kv), local(v, mine_kv)
    joint_kv = None
    if joint:
        joint_kv = tuple(local(x, slice(None)) for x in joint)
    _counters()
    with torch.no_grad():
        out, lse = token_ring_attn(
            ql, kl, vl, layout=case["layout"], joint_kv=joint_kv,
            joint_strategy=case["joint"][0] if joint else "rear", final_chunks=case["chunks"],
            cuda_graph=False,  # a capture would count its messages again (see _graphed)
        )  # fmt: skip
    counts = _counters()
    want_out = ref_out[:, :, mine_q]
    got_out = out.double().cpu()
    got_out = got_out.transpose(1, 2) if bshd else got_out
    errs = {
        "out": (got_out - want_out).abs().max().item(),
        "lse": (lse.double().cpu() - ref_lse[:, :, mine_q]).abs().max().item(),
    }
    kernel = {}
    if device != "cpu" and dtype != torch.float32:
        # the kernel's own bf16 error: one SDPA call (cuDNN) over all keys for our queries
        from torch.nn.attention import SDPBackend, sdpa_kernel

        args = [x.to(dtype).cuda() for x in (q[:, :, mine_q], keys, vals)]
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION), torch.no_grad():
            one = torch.nn.functional.scaled_dot_product_attention(*args, scale=scale)
        kernel["out"] = (one.double().cpu() - want_out).abs().max().item()
    return errs, counts, kernel


def _train_case(case, rank, n, device):
    from tokenring_xdit.ring import token_ring_attn_func

    dtype = getattr(torch, case["dtype"])
    (q, k, v, do), q_pos, kv_pos = _shards(case, n)
    q, k, v, do = (x.to(dtype).double() for x in (q, k, v, do))
    ref_in = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = torch.nn.functional.scaled_dot_product_attention(*ref_in, is_causal=case["causal"])
    ref.backward(do)
    d = q.shape[-1]
    scores = (q @ k.transpose(-1, -2)) * d**-0.5
    if case["causal"]:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    ref_lse = torch.logsumexp(scores, -1)
    bshd = case["layout"] == "bshd"

    def local(x, pos):
        x = x[:, :, pos[rank]]
        return (x.transpose(1, 2) if bshd else x).to(dtype).contiguous().to(device)

    def back(x):  # our layout -> (b, h, s, d) float64 on the CPU
        x = x.detach().double().cpu()
        return x.transpose(1, 2) if bshd else x

    ql, kl, vl = (local(x, p).requires_grad_() for x, p in ((q, q_pos), (k, kv_pos), (v, kv_pos)))
    _counters()
    # a causal call proves its zigzag layout with the global positions of its shard
    positions = torch.tensor(q_pos[rank], device=device) if case["causal"] else None
    out, lse, _ = token_ring_attn_func(
        ql, kl, vl, causal=case["causal"], layout=case["layout"], return_attn_probs=True,
        positions=positions, cuda_graph=False,  # eager on both sides: the same posts to count
    )  # fmt: skip
    fwd = _counters()
    out.backward(local(do, q_pos))
    bwd = _counters()
    errs = {
        "out": (back(out) - ref.detach()[:, :, q_pos[rank]]).abs().max().item(),
        "lse": (lse.detach().double().cpu() - ref_lse[:, :, q_pos[rank]]).abs().max().item(),
    }
    for name, g, r, p in zip(("dq", "dk", "dv"), (ql.grad, kl.grad, vl.grad), ref_in,
                             (q_pos, kv_pos, kv_pos), strict=True):  # fmt: skip
        errs[name] = (back(g) - r.grad[:, :, p[rank]]).abs().max().item()
    kernel = {}
    if device != "cpu" and dtype != torch.float32:
        # the kernels' own bf16 error: SDPA fwd + bwd over the whole sequence in one process
        one_in = [x.to(dtype).cuda().requires_grad_() for x in (q, k, v)]
        one = torch.nn.functional.scaled_dot_product_attention(*one_in, is_causal=case["causal"])
        one.backward(do.to(dtype).cuda())
        kernel["out"] = (one.detach().double().cpu() - ref.detach()).abs().max().item()
        for name, g, r in zip(("dq", "dk", "dv"), one_in, ref_in, strict=True):
            kernel[name] = (g.grad.double().cpu() - r.grad).abs().max().item()
    return errs, {"fwd": fwd, "bwd": bwd}, kernel


def _yunchang_ring_only(rank, n, device="cuda"):
    """yunchang LongContextAttention(ring_impl_type='token_ring'), ring degree n, bf16."""
    import tokenring_xdit

    tokenring_xdit.install()
    from yunchang import EXTRACT_FUNC_DICT, LongContextAttention, set_seq_parallel_pg
    from yunchang.kernels import AttnType

    set_seq_parallel_pg(1, n, rank, n)
    gen = torch.Generator().manual_seed(77)
    b, s, h, d = 1, 64 * n, 4, 64
    q, k, v, do = (torch.randn(b, s, h, d, generator=gen, dtype=torch.float64) for _ in range(4))
    q, k, v, do = (x.bfloat16().double() for x in (q, k, v, do))

    def shard(x):
        return EXTRACT_FUNC_DICT["token_ring"](x, rank, world_size=n, rd=n, ud=1)

    errs = {}
    for causal in (True, False):
        ref_in = [x.clone().requires_grad_() for x in (q, k, v)]
        ref = torch.nn.functional.scaled_dot_product_attention(
            *(x.transpose(1, 2) for x in ref_in), is_causal=causal
        ).transpose(1, 2)
        ref.backward(do)
        layer = LongContextAttention(ring_impl_type="token_ring", attn_type=AttnType.TORCH_FLASH)
        loc = [shard(x).bfloat16().to(device).requires_grad_() for x in (q, k, v)]
        out = layer(*loc, causal=causal)
        out.backward(shard(do).bfloat16().to(device))
        tag = "causal" if causal else "noncausal"
        errs[tag] = {"out": (out.double().cpu() - shard(ref.detach())).abs().max().item()}
        for name, x, r in zip(("dq", "dk", "dv"), loc, ref_in, strict=True):
            errs[tag][name] = (x.grad.double().cpu() - shard(r.grad)).abs().max().item()
    return errs


def _graphed(rank, n):
    """cuda_graph=True over ipc: the first call runs eagerly and captures, the next two replay
    the graph (stream write/wait value captured); every output vs exact attention."""
    import torch.distributed as dist

    from tokenring_xdit.ring import token_ring_attn
    from tokenring_xdit.ring.graph_cache import RING_GRAPHS

    gen = torch.Generator().manual_seed(5 + rank)
    errs = []
    before = (RING_GRAPHS.stats.captures, RING_GRAPHS.stats.replays)
    for _ in range(3):
        q, k, v = (torch.randn(1, 128, 4, 64, generator=gen).bfloat16() for _ in "qkv")
        everyone = [None] * n
        dist.all_gather_object(everyone, (q, k, v))
        gk, gv = (torch.cat([e[i] for e in everyone], 1).transpose(1, 2).double() for i in (1, 2))
        ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2).double(), gk, gv)
        with torch.no_grad():
            out, _ = token_ring_attn(q.cuda(), k.cuda(), v.cuda(), kernel="cudnn", cuda_graph=True)
        errs.append((out.double().cpu() - ref.transpose(1, 2)).abs().max().item())
    return {
        "captures": RING_GRAPHS.stats.captures - before[0],
        "replays": RING_GRAPHS.stats.replays - before[1],
        "refused": list(RING_GRAPHS.stats.refused),
        "errs": errs,
    }


def _worker(rank, n):
    torch.cuda.set_device(0)
    result = {"infer": {}, "train": {}}
    for case in INFER:
        _transport("nccl")  # CPU tensors on the gloo lanes: the reference message counts
        _, cpu_counts, _ = _infer_case(case, rank, n, "cpu")
        _transport("ipc")
        errs, counts, kernel = _infer_case(case, rank, n, "cuda")
        result["infer"][case["name"]] = dict(errs=errs, kernel=kernel, counts=counts,
                                             cpu_counts=cpu_counts)  # fmt: skip
    for case in TRAIN:
        _transport("nccl")
        _, cpu_counts, _ = _train_case(case, rank, n, "cpu")
        _transport("ipc")
        errs, counts, kernel = _train_case(case, rank, n, "cuda")
        result["train"][case["name"]] = dict(errs=errs, kernel=kernel, counts=counts,
                                             cpu_counts=cpu_counts)  # fmt: skip
    try:
        result["graph"] = _graphed(rank, n)
    except Exception as exc:  # reported by its own test; the other results still count
        result["graph"] = f"{type(exc).__name__}: {str(exc)[:500]}"
    try:
        result["yunchang"] = _yunchang_ring_only(rank, n)
    except Exception as exc:  # reported by its own test; the other results still count
        result["yunchang"] = f"{type(exc).__name__}: {str(exc)[:500]}"
    torch.cuda.synchronize()
    return result


@functools.cache
def _launch(n):
    return values(run_ranks(_worker, n, timeout=420, env={"TOKENRING_XDIT_TRANSPORT": "ipc"}))


def _bound(what, err_kernel):
    return max(2 * err_kernel, BF16_FLOOR[what]) if err_kernel is not None else FP32_TOL


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ipc_ring_on_one_gpu_matches_exact_attention(n):
    failures = []
    for rank, res in enumerate(_launch(n)):
        for kind in ("infer", "train"):
            for name, got in res[kind].items():
                bf16 = name.startswith("bf16")
                for what, err in got["errs"].items():
                    kernel_err = got["kernel"].get(what, got["kernel"].get("out")) if bf16 else None
                    tol = _bound(what, kernel_err)
                    alone = "-" if kernel_err is None else f"{kernel_err:.3g}"
                    print(f"N={n} rank {rank} {kind} {name} {what}: {err:.3g} "
                          f"(kernel alone {alone}, bound {tol:.3g})")  # fmt: skip
                    if not err <= tol:
                        failures.append(f"N={n} rank {rank} {name} {what}: {err:.3g} > {tol:.3g}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ipc_message_counts_equal_the_torch_distributed_lanes(n):
    for rank, res in enumerate(_launch(n)):
        for kind in ("infer", "train"):
            for name, got in res[kind].items():
                assert got["counts"] == got["cpu_counts"], (n, rank, name, got)
                assert got["counts"], (n, rank, name)


@pytest.mark.parametrize("n", [2, 3])
def test_ipc_ring_calls_are_captured_and_replayed(n):
    for rank, res in enumerate(_launch(n)):
        got = res["graph"]
        print(f"N={n} rank {rank} graphs: {got}")
        assert isinstance(got, dict), (rank, got)
        assert (got["captures"], got["replays"]) == (1, 2), (rank, got)
        assert max(got["errs"]) <= BF16_FLOOR["out"], (rank, got)


@pytest.mark.parametrize("n", [2, 4])
def test_ipc_yunchang_ring_only_long_context_attention(n):
    for rank, res in enumerate(_launch(n)):
        assert isinstance(res["yunchang"], dict), (rank, res["yunchang"])
        for tag, errs in res["yunchang"].items():
            for what, err in errs.items():
                print(f"N={n} rank {rank} yunchang {tag} {what}: {err:.3g}")
                assert err <= BF16_FLOOR[what], (n, rank, tag, what, err)


def _fault(rank, n, report, mode):
    """The last rank fails at its second block kernel (dies, or raises and stays alive); every
    other rank must raise TokenRingCommError within the group's timeout."""
    import datetime

    import torch.distributed as dist

    from tokenring_xdit.ring import token_ring_attn
    from tokenring_xdit.ring.kernels import KERNELS

    torch.cuda.set_device(0)
    dist.distributed_c10d._set_pg_timeout(
        datetime.timedelta(seconds=GROUP_TIMEOUT_S), dist.group.WORLD
    )
    calls = [0]

    def kernel(q, k, v, scale, layout):
        calls[0] += 1
        if rank == n - 1 and calls[0] == 2:
            if mode == "dies":
                os._exit(17)
            raise RuntimeError("injected failure")
        return KERNELS["cudnn"](q, k, v, scale, layout)

    gen = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(1, 256, 4, 64, generator=gen).bfloat16().cuda() for _ in "qkv")
    start = time.monotonic()
    try:
        with torch.no_grad():
            token_ring_attn(q, k, v, kernel=kernel)
    except RuntimeError as exc:
        if rank == n - 1:
            time.sleep(GROUP_TIMEOUT_S + 4)
            return ("injected", str(exc), 0.0)
        elapsed = time.monotonic() - start
        torch.cuda.synchronize()  # released: must not hang
        return (type(exc).__name__, str(exc), elapsed)
    return ("no error", "", time.monotonic() - start)


@pytest.mark.parametrize("mode", ["dies", "raises_and_stays"])
@pytest.mark.parametrize("n", [2, 4])
def test_ipc_peer_failure_mid_call_is_named_within_the_timeout(n, mode):
    outcomes = launch_outcomes(
        _fault, n, (mode,), timeout=GROUP_TIMEOUT_S + 60,
        env={"OMP_NUM_THREADS": "1", "TOKENRING_XDIT_TRANSPORT": "ipc"},
    )  # fmt: skip
    failing = outcomes[-1]
    if mode == "dies":
        assert not failing.ok and failing.failure.error_type == "ProcessDied", failing
    else:
        assert failing.ok and failing.value[0] == "injected", failing
    for o in outcomes[:-1]:
        assert o.ok, f"rank {o.rank}: {o.failure}"
        kind, message, elapsed = o.value
        assert kind == "TokenRingCommError", (o.rank, kind, message)
        assert "global rank" in message and "step" in message and "(ipc" in message, message
        assert elapsed < GROUP_TIMEOUT_S + 5, (o.rank, elapsed, message)
