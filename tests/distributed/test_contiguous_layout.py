"""The contiguous layout through the ring: randomized packed rows vs exact fp64 attention.

A causal packed row cut in N contiguous shards (`make_split(..., layout="contiguous")`,
schedules/contiguous.py): a document inside one shard never leaves its rank, one that crosses
shard boundaries sends its queries back one hop per shard it reaches. Seeded and reproducible:
case i of ring size N draws a row whose total divides by N (not always by 2N) with documents
of length 1 .. the whole row (one document spanning every rank, length-1 documents, documents
crossing several shards), causal (and a few non-causal rows, which the layout leaves to the
row's own contiguous split), MHA or GQA, both tensor layouts, the split passed with its
documents (and `positions=shard_positions(split, rank)`, checked) or without them beside
cu_seqlens. Each rank compares out, lse, dq, dk, dv with autograd of exact fp64 attention under
the document mask on the whole row; its kernel calls and Q transfers equal the plan's
(`document_work(..., layout="contiguous")`). Bad input (documents that contradict the split,
positions that are not its shards', unequal shards, a causal contiguous split stripped of its
documents, the documents layout without cu_seqlens) is one error on every rank. One launch per ring size (gloo, CPU).
"""

from __future__ import annotations

import functools

import pytest

from tests.distributed.test_doc_layout import TOL, _case, _try
from tests.distributed.test_doc_layout import _draw as _doc_draw
from tests.harness import run_ranks, values

SEED = 20261127
CASES_PER_SIZE = 12  # x 3 ring sizes


def _draw(n: int, i: int) -> dict:
    """test_doc_layout's drawer over rows of N x (2, 3, 5 or 7) tokens, in contiguous shards."""
    return _doc_draw(n, i, seed=SEED, unit=1, split="contiguous")


def _errors(rank: int, n: int) -> dict:
    from dataclasses import replace

    import torch

    from tokenring_xdit import make_split, shard, shard_positions
    from tokenring_xdit.ring.api import token_ring_attn

    s = 4 * n
    cu = [0, 3, s]
    full = torch.randn(1, s, 2, 8)
    zig_split = make_split(s, n, causal=True, cu_seqlens=[0, 5, s], layout="zigzag")
    split = make_split(s, n, causal=True, cu_seqlens=cu, layout="contiguous")
    zig_pos = shard_positions(zig_split, rank)
    contig = shard(full, split=split)

    def call(x, **kw):
        return lambda: token_ring_attn(x, x, x, causal=True, **kw)

    cases = {
        "docs_contradict": call(contig, split=split, cu_seqlens=[0, 5, s]),
        "zigzag_positions": call(full[:, zig_pos], split=split, positions=zig_pos),
        "unequal": call(full[:, : 3 + (rank == 0)], split=split),
        "dense": call(contig, split=replace(split, docs=None)),
        "no_documents": lambda: shard(full, causal=True, layout="documents"),
    }
    return {name: _try(fn) for name, fn in cases.items()}


def _rank(rank: int, n: int) -> dict:
    import torch

    from tokenring_xdit.ring.packed import document_work

    torch.set_num_threads(1)
    results = []
    for i in range(CASES_PER_SIZE):
        c = _draw(n, i)
        res = _case(rank, n, c)
        work = document_work(c["cu"], n, causal=c["causal"], layout="contiguous")
        res["plan_kernels"] = work["ranks"][rank]["kernel_calls"]
        res["plan_q"] = work["ranks"][rank]["q_transfers"]
        res["plan_layout"] = work["layout"]
        results.append(res)
    return {"cases": results, "errors": _errors(rank, n)}


@functools.cache
def _launch(n: int) -> list:
    return values(run_ranks(_rank, n, timeout=600))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_contiguous_layout_matches_exact_attention(n):
    worst = {}
    for rank, res in enumerate(_launch(n)):
        for i, case in enumerate(res["cases"]):
            c = _draw(n, i)
            assert case["plan_layout"] == ("contiguous" if c["causal"] else "zigzag"), case
            assert case["kernels"] == case["plan_kernels"], (rank, i, case)
            assert case["q_messages"] == case["plan_q"], (rank, i, case)
            for name, err in case["errs"].items():
                if err > worst.get(name, (0.0,))[0]:
                    worst[name] = (err, rank, i, c)
    assert set(worst) == {"out", "lse", "dq", "dk", "dv"}
    assert all(w[0] < TOL for w in worst.values()), worst


def test_the_draws_cover_what_the_layout_needs():
    """Rows not divisible by 2N, one document over every rank, documents crossing several
    shards, length-1 documents, both proofs, a non-causal row."""
    draws = [(n, _draw(n, i)) for n in (2, 3, 4) for i in range(CASES_PER_SIZE)]
    assert any(c["total"] % (2 * n) for n, c in draws)
    assert any(len(c["cu"]) == 2 for _, c in draws)
    lengths = [(n, c, b - a) for n, c in draws for a, b in zip(c["cu"], c["cu"][1:], strict=False)]
    assert any(x == 1 for _, _, x in lengths)
    assert any(x > 2 * c["total"] // n for n, c, x in lengths)  # over more than two shards
    assert {c["explicit"] for _, c in draws} == {True, False}
    assert {c["causal"] for _, c in draws} == {True, False}


EXPECT = {
    "docs_contradict": "cu_seqlens differ from the split's documents",
    "zigzag_positions": "not this rank's contiguous positions",
    "unequal": "tokens on every rank: local lengths [4, 3",
    "dense": "over contiguous shards needs the row's documents",
    "no_documents": "pass cu_seqlens=",
}


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("name", sorted(EXPECT))
def test_bad_input_is_one_error_on_every_rank(n, name):
    said = [res["errors"][name] for res in _launch(n)]
    assert all(EXPECT[name] in s for s in said), said
    if name != "no_documents":  # shard's own error, on each rank alone
        assert len(set(said)) == 1, said
