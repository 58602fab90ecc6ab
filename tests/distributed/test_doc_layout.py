"""The documents layout through the ring: randomized packed rows vs exact fp64 attention.

Seeded and reproducible: case i of ring size N draws on every rank a packed row whose total
divides by 2N but whose documents mostly do not (lengths 1 .. the whole row: length-1
documents, documents shorter than 2N with empty pieces, one document spanning every rank),
causal or not, MHA or GQA, layout, and how the call gets its split: with its documents (and,
causal, the shard's positions from `shard_positions`, checked against it), or without them beside
cu_seqlens as a tensor (the form a compiled graph keeps its documents out of). Each rank runs the differentiable call on its shard (fp32) and compares
out, lse, dq, dk, dv with autograd of exact fp64 attention under the document mask on the whole
row (tests/distributed/test_packed_documents.py's reference); its kernel calls and Q transfers
equal the documents plan's (`document_work(..., layout="documents")`). Bad input (documents
that differ across ranks, a layout that does not match the shards, a row that does not split
into 2N equal slots) is one error on every rank. One launch per ring size (gloo, CPU).
"""

from __future__ import annotations

import functools
import random

import pytest

from tests.distributed.test_packed_documents import _reference
from tests.harness import run_ranks, values

SEED = 20261126
CASES_PER_SIZE = 16  # x 3 ring sizes
TOL = 2e-5


def _draw(n: int, i: int, seed=SEED, unit: int = 2, split: str = "documents") -> dict:
    """Case i of ring size N: a row of `unit` x N x (2, 3, 5 or 7) tokens cut in `split`."""
    rng = random.Random(f"{seed}/{n}/{i}")
    total = unit * n * rng.choice([2, 3, 5, 7])
    count = rng.randint(1, min(12, total))
    if i % 8 == 0:
        count = 1  # one document spanning every rank
    cuts = sorted(rng.sample(range(1, total), count - 1))
    if i % 4 == 1 and total - 1 not in cuts:
        cuts.append(total - 1)  # a length-1 document last
    return {
        "total": total,
        "cu": [0, *cuts, total],
        "causal": i % 3 != 2,
        "hk": rng.choice([4, 2, 1]),
        "d": rng.choice([8, 16]),
        "layout": rng.choice(["bshd", "bhsd"]),
        "explicit": i % 5 == 3,  # the split with its documents (+ positions, checked)
        "seed": rng.randrange(2**31),
        "split": split,
    }


def _case(rank: int, n: int, c: dict) -> dict:
    from dataclasses import replace

    import torch

    from tokenring_xdit import make_split, shard, shard_positions
    from tokenring_xdit.ring.api import token_ring_attn
    from tokenring_xdit.ring.comm import COUNTERS

    gen = torch.Generator().manual_seed(c["seed"])
    s, h, hk, d, cu, causal = c["total"], 4, c["hk"], c["d"], c["cu"], c["causal"]
    q, do = (torch.randn(1, s, h, d, generator=gen, dtype=torch.float64) for _ in "qo")
    k, v = (torch.randn(1, s, hk, d, generator=gen, dtype=torch.float64) for _ in "kv")
    q, k, v, do = (x.float().double() for x in (q, k, v, do))  # the ring's rounded inputs
    ref = _reference(torch, q, k, v, do, cu, causal)
    split = make_split(s, n, causal=causal, cu_seqlens=cu, layout=c.get("split", "documents"))
    pos = shard_positions(split, rank)

    def local(x):  # (1, S, ...) -> this rank's shard, in the case's layout
        x = x[:, pos] if c["explicit"] else shard(x, split=split)
        return x if c["layout"] == "bshd" else x.transpose(1, 2).contiguous()

    def back(x):
        return x if c["layout"] == "bshd" else x.transpose(1, 2)

    ins = [local(x).float().requires_grad_() for x in (q, k, v)]
    if c["explicit"]:
        kwargs = {"split": split, "positions": pos if causal else None}
    else:
        kwargs = {"split": replace(split, docs=None), "cu_seqlens": torch.tensor(cu).int()}
    COUNTERS.reset()
    out, lse = token_ring_attn(*ins, causal=causal, layout=c["layout"], **kwargs)
    fwd_kernels, fwd_q = COUNTERS.kernel_calls, COUNTERS.q_messages
    out.backward(local(do).float())
    errs = {"out": (back(out).double() - ref[0][:, pos]).abs().max().item()}
    ref_lse = ref[1][:, :, pos]
    errs["lse"] = ((lse.double() - ref_lse).abs() / ref_lse.abs().clamp_min(1)).max().item()
    for name, x, r in zip(("dq", "dk", "dv"), ins, ref[2:], strict=True):
        errs[name] = (back(x.grad).double() - r[:, pos]).abs().max().item()
    return {"errs": errs, "kernels": fwd_kernels, "q_messages": fwd_q}


def _try(fn) -> str:
    try:
        fn()
    except (ValueError, NotImplementedError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _errors(rank: int, n: int) -> dict:
    """Bad input: raised on every rank before any transfer (or by make_split on every rank)."""
    from dataclasses import replace

    import torch

    from tokenring_xdit import make_split, shard, shard_positions
    from tokenring_xdit.ring.api import token_ring_attn

    s = 4 * n
    cu = [0, 3, s]
    full = torch.randn(1, s, 2, 8)
    zig_split = make_split(s, n, causal=True, cu_seqlens=[0, 5, s], layout="zigzag")
    doc_split = make_split(s, n, causal=True, cu_seqlens=cu, layout="documents")
    zig, per_doc = shard(full, split=zig_split), shard(full, split=doc_split)
    row = torch.randn(1, s + 2, 2, 8)  # s + 2 tokens: no 2N equal slots
    no_docs = replace(doc_split, docs=None)

    def call(x, **kw):
        return lambda: token_ring_attn(x, x, x, **kw)

    cases = {
        "docs_differ": call(per_doc, causal=True, split=no_docs, cu_seqlens=[0, 3 + rank, s]),
        "docs_contradict": call(zig, causal=True, split=zig_split, cu_seqlens=cu),
        "positions_contradict": call(
            per_doc, causal=True, split=doc_split, positions=shard_positions(zig_split, rank)
        ),
        "no_split": call(shard(full, causal=True), causal=True, cu_seqlens=[0, s - 1, s]),
        "split_differs": call(per_doc, causal=True, split=doc_split if rank == 0 else zig_split),
        "by_position_ids": call(per_doc, split=no_docs, position_ids=torch.arange(4)),
        # 3 tokens on every rank, a split of 4 per rank
        "odd_rows": call(
            row[:, :3],
            split=make_split(s, n, causal=False, cu_seqlens=[0, 1, s], layout="documents"),
        ),
        "shard_odd": lambda: shard(row, causal=True, cu_seqlens=[0, 1, s + 2], layout="documents"),
        "bad_layout": lambda: shard(full, causal=True, cu_seqlens=cu, layout="rows"),
    }
    return {name: _try(fn) for name, fn in cases.items()}


# --- auto: the layout `shard(..., layout="auto")` picks, on every rank alone ------------------

AUTO_CASES = 8  # per ring size


def _draw_auto(n: int, i: int) -> dict:
    """Rows of 10-40 tokens per rank with one long document among short ones (the row's zigzag
    unbalanced), or short ones only; even cases are cut by `auto` with the packaged table,
    odd ones in the layout a pairs-only table picks (`_pairs_only`), so both layouts run."""
    rng = random.Random(f"{SEED}/auto/{n}/{i}")
    total = 2 * n * rng.randint(5, 20)
    long_at = rng.randrange(total // 2)
    cuts = {long_at, long_at + total // 2} if i % 4 < 2 else set()
    cuts |= set(rng.sample(range(1, total), rng.randint(1, 6)))
    cu = [0, *sorted(x for x in cuts if 0 < x < total), total]
    return {
        "total": total, "cu": cu, "causal": i % 3 != 2, "hk": rng.choice([4, 2]), "d": 8,
        "layout": "bshd", "explicit": False, "seed": rng.randrange(2**31),
        "table": "packaged" if i % 2 == 0 else "pairs_only",
    }  # fmt: skip


def _pairs_only():
    from tokenring_xdit.ring.packed.cost import LayoutCost

    return LayoutCost(tile=1, tile_ms=1e-6, segment_ms=0.0, call_ms=0.0, row_ms=0.0)


def _auto_case(rank: int, n: int, c: dict) -> dict:
    from tokenring_xdit.ring.packed import Documents, pick_layout

    docs = Documents.of(c["cu"])
    picked = pick_layout(docs, n, c["causal"])  # what shard(layout="auto") cuts
    if c["table"] == "packaged":
        res = _case(rank, n, {**c, "split": "auto"})
    else:
        picked = pick_layout(docs, n, c["causal"], cost=_pairs_only())
        res = _case(rank, n, {**c, "split": picked})
    return {**res, "picked": picked, **_kernel_picks(n, c, picked)}


def _kernel_picks(n: int, c: dict, picked: str) -> dict:
    """The packed kernel `auto` would run on CUDA in bf16 (the pure choice, no GPU: every
    kernel taken as working), on this row and on it scaled x64 and x1024 (where cuDNN per
    segment wins), each in the layout `auto` cuts it in; and the record the CPU call resolves
    (masked, whatever the documents)."""
    import torch

    from tokenring_xdit.ring.kernels.registry import auto_doc_kernel
    from tokenring_xdit.ring.packed import Documents, kernel_order
    from tokenring_xdit.ring.packed.pick import pick
    from tokenring_xdit.ring.seam.kernel_choice import resolve_kernel
    from tokenring_xdit.ring.tensor_layout import BSHD

    cuda, pairs = [], []
    for scale in (1, 64, 1024):
        docs = Documents(tuple(x * scale for x in c["cu"]))
        layout, kernel = pick(docs, n, c["causal"])
        order = kernel_order(docs, n, c["causal"], layout)
        cuda.append(auto_doc_kernel("cuda", torch.bfloat16, order, lambda name: True))
        pairs.append([layout, kernel])
    q = torch.zeros(1, c["total"] // n, 4, 8)
    order = kernel_order(Documents(tuple(c["cu"])), n, c["causal"], picked)
    cpu = resolve_kernel("auto", None, q, q, q, BSHD, train=True, deterministic=False,
                         packed=True, order=order)  # fmt: skip
    return {"cuda_kernels": cuda, "pairs": pairs, "cpu_family": list(cpu.family)}


def _rank(rank: int, n: int) -> dict:
    import torch

    from tokenring_xdit.ring.packed import document_work

    torch.set_num_threads(1)
    results, autos = [], []
    for i in range(CASES_PER_SIZE):
        c = _draw(n, i)
        res = _case(rank, n, c)
        work = document_work(c["cu"], n, causal=c["causal"], layout="documents")["ranks"][rank]
        res["plan_kernels"], res["plan_q"] = work["kernel_calls"], work["q_transfers"]
        results.append(res)
    for i in range(AUTO_CASES):
        c = _draw_auto(n, i)
        res = _auto_case(rank, n, c)
        work = document_work(c["cu"], n, causal=c["causal"], layout=res["picked"])["ranks"][rank]
        res["plan_kernels"], res["plan_q"] = work["kernel_calls"], work["q_transfers"]
        autos.append(res)
    return {"cases": results, "autos": autos, "errors": _errors(rank, n)}


@functools.cache
def _launch(n: int) -> list:
    return values(run_ranks(_rank, n, timeout=600))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_documents_layout_matches_exact_attention(n):
    worst = {}
    for rank, res in enumerate(_launch(n)):
        for i, case in enumerate(res["cases"]):
            assert case["kernels"] == case["plan_kernels"], (rank, i, case)
            assert case["q_messages"] == case["plan_q"], (rank, i, case)
            for name, err in case["errs"].items():
                if err > worst.get(name, (0.0,))[0]:
                    worst[name] = (err, rank, i, _draw(n, i))
    print(f"N={n} worst errors:", {k: v[0] for k, v in worst.items()})
    assert set(worst) == {"out", "lse", "dq", "dk", "dv"}
    for name, (err, rank, i, c) in worst.items():
        assert err <= TOL, f"{name} error {err:.3g} on rank {rank}, case {i}: {c}"


@pytest.mark.parametrize("n", [2, 3, 4])
def test_auto_is_agreed_and_exact_either_way(n):
    """Every rank picks alone from the documents; all pick alike (the packaged table's choice
    is also document_work's here), the shards of the choice give exact attention whichever
    layout it is, and across the cases both layouts ran."""
    from tokenring_xdit.ring.packed import document_work

    ranks = _launch(n)
    used = set()
    for i in range(AUTO_CASES):
        c = _draw_auto(n, i)
        picks = {res["autos"][i]["picked"] for res in ranks}
        assert len(picks) == 1, (i, picks)
        picked = picks.pop()
        used.add(picked)
        if c["table"] == "packaged":
            assert picked == document_work(c["cu"], n, causal=c["causal"])["auto"]
        for rank, res in enumerate(ranks):
            case = res["autos"][i]
            assert case["kernels"] == case["plan_kernels"], (rank, i, case)
            assert case["q_messages"] == case["plan_q"], (rank, i, case)
            for name, err in case["errs"].items():
                assert err <= TOL, f"auto case {i} ({picked}): {name} {err:.3g} on rank {rank}"
    assert {"zigzag", "documents"} <= used, used  # and "contiguous" where predicted fastest


@pytest.mark.parametrize("n", [2, 3, 4])
def test_the_packed_kernel_pick_is_agreed_and_changes_nothing_on_cpu(n):
    """Every rank picks the CUDA half-precision kernel alone from the documents, ring size and
    layout: all alike, `pick`'s kernel, both kernels across the scaled rows; on the CPU the
    call's record stays the masked kernel (its exactness: the test above)."""
    ranks = _launch(n)
    kernels = set()
    for i in range(AUTO_CASES):
        got = {repr((res["autos"][i]["cuda_kernels"], res["autos"][i]["pairs"])) for res in ranks}
        assert len(got) == 1, (i, got)
        case = ranks[0]["autos"][i]
        assert case["cuda_kernels"] == [k for _, k in case["pairs"]]
        kernels |= set(case["cuda_kernels"])
        for res in ranks:
            assert res["autos"][i]["cpu_family"] == ["pair", "masked", False]
    assert kernels == {"flash_varlen", "cudnn"}, kernels


def test_the_draws_cover_what_the_issue_asks():
    draws = [_draw(n, i) for n in (2, 3, 4) for i in range(CASES_PER_SIZE)]
    lengths = [b - a for c in draws for a, b in zip(c["cu"], c["cu"][1:], strict=False)]
    assert 1 in lengths
    assert any(c["cu"] == [0, c["total"]] for c in draws)  # one document on every rank
    n_of = [n for n in (2, 3, 4) for _ in range(CASES_PER_SIZE)]
    assert sum((b - a) % (2 * n) != 0 for c, n in zip(draws, n_of, strict=True)
               for a, b in zip(c["cu"], c["cu"][1:], strict=False)) > 50  # fmt: skip
    assert {c["causal"] for c in draws} == {True, False}
    assert {c["hk"] for c in draws} == {4, 2, 1}
    assert {c["explicit"] for c in draws} == {True, False}


EXPECT = {
    "docs_differ": "packed documents",
    "docs_contradict": "cu_seqlens differ from the split's documents",
    "positions_contradict": "not this rank's documents positions",
    "no_split": "needs proof",
    "split_differs": "split of the sequence (split=, or what positions= prove) differs across",
    "by_position_ids": "needs the documents as cu_seqlens",
    "odd_rows": "holds 4 tokens on every rank",
    "shard_odd": "multiple of 2 x",
    "bad_layout": "layout must be",
}


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("name", sorted(EXPECT))
def test_bad_input_is_one_error_on_every_rank(n, name):
    msgs = [res["errors"][name] for res in _launch(n)]
    assert len({m.split(":")[0] for m in msgs}) == 1, msgs
    for msg in msgs:
        assert EXPECT[name] in msg, msg
