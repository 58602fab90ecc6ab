"""The documents layout without a process group: the piece rule, the balance it promises
(spread <= 1.10) on realistic rows, and the kernels' merge of a query piece that meets two key
pieces in one block (the plan's coverage of every pair: tests/unit/test_packed_documents.py)."""

from __future__ import annotations

import random

import pytest
import torch

from tokenring_xdit.ring.packed.doc_split import (
    DOCUMENTS,
    local_pieces,
    local_positions,
    piece_lengths,
    piece_pairs,
)
from tokenring_xdit.ring.packed import Documents, doc_plan, document_work, pick_layout
from tokenring_xdit.ring.packed.pick import AUTO_MARGIN
from tokenring_xdit.ring.segments import Segment
from tokenring_xdit.ring.kernels import MASKED, PAIRS, segment_runs, segments_pair
from tokenring_xdit.ring.tensor_layout import BHSD, BSHD
from tokenring_xdit.ring.schedules import CAUSAL_ZIGZAG, NON_CAUSAL_BLOCKS


def test_worked_example_of_the_docstring():
    assert piece_lengths((0, 7, 9, 16), 2) == ((2, 2, 2, 1), (1, 0, 0, 1), (1, 2, 2, 2))
    assert local_positions((0, 7, 9, 16), 0, 2) == [0, 1, 7, 9, 6, 8, 14, 15]
    assert local_positions((0, 7, 9, 16), 1, 2) == [2, 3, 10, 11, 4, 5, 12, 13]


def _random_bounds(rng: random.Random, total: int) -> tuple[int, ...]:
    count = rng.randint(1, min(30, total))
    return (0, *sorted(rng.sample(range(1, total), count - 1)), total)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_pieces_keep_every_token_in_order_and_equal_halves(n):
    rng = random.Random(n)
    for _ in range(30):
        total = 2 * n * rng.randint(1, 9)
        bounds = _random_bounds(rng, total)
        lens = piece_lengths(bounds, n)
        for (a, b), pieces in zip(zip(bounds, bounds[1:], strict=False), lens, strict=True):
            assert sum(pieces) == b - a and max(pieces) - min(pieces) <= 1
        assert all(sum(col) == total // (2 * n) for col in zip(*lens, strict=True))
        every = []
        d = len(bounds) - 1
        for r in range(n):
            pieces = local_pieces(bounds, r, n)
            halves = [sum(g1 - g0 for *_, g0, g1 in p) for p in (pieces[:d], pieces[d:])]
            assert halves == [total // (2 * n)] * 2
            every += local_positions(bounds, r, n)
        assert sorted(every) == list(range(total))


def test_total_must_divide_by_2n():
    with pytest.raises(ValueError, match="multiple of 2 x 3 = 6"):
        local_pieces((0, 5, 10), 0, 3)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [True, False])
def test_lazy_plan_knows_which_blocks_attend_without_making_them(n, causal):
    """The documents plan makes a block's segments when asked; whether the others attend comes
    from the documents of their pieces, and it must equal what making them would say."""
    rng = random.Random(7 * n + causal)
    schedule = CAUSAL_ZIGZAG if causal else NON_CAUSAL_BLOCKS
    for _ in range(25):
        total = 2 * n * rng.randint(1, 8)
        docs = Documents(_random_bounds(rng, total))
        plan = doc_plan.__wrapped__(docs, schedule, (total // n,) * n, DOCUMENTS)  # uncached
        said = [[plan.attends(r, t) for t in range(n + 1)] for r in range(n)]
        assert all(plan.steps[r][t].causal for r, t in plan._made)  # only diagonals were made
        made = [[bool(plan.block(r, t)) for t in range(n + 1)] for r in range(n)]
        assert said == made, (n, docs)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [True, False])
def test_auto_predicts_from_piece_lengths_what_the_plan_says(n, causal):
    """`shard`'s auto asks pick_layout for every new row: it counts the documents layout's
    pairs from the piece lengths (piece_pairs), which must equal the plan's, and picks what
    document_work reports."""
    rng = random.Random(11 * n + causal)
    for _ in range(25):
        total = 2 * n * rng.randint(1, 8)
        docs = Documents(_random_bounds(rng, total))
        report = document_work(docs.bounds, n, causal=causal, layout=DOCUMENTS)
        assert piece_pairs(docs.bounds, n, causal) == [r["pairs"] for r in report["ranks"]]
        assert pick_layout(docs, n, causal) == (report["auto"] if n > 1 else "zigzag")


# --- the balance: spread <= 1.10 where the row's zigzag is far off --------------------------


def _sweep(total: int, seed: int = 0) -> list[int]:
    """benchmarks/packed_varlen.py's documents: 512-8192 tokens, the last one cut to fit."""
    rng, cu = random.Random(seed), [0]
    while cu[-1] < total:
        cu.append(min(total, cu[-1] + rng.randint(512, 8192)))
    return cu


def _long_among_short(total: int) -> list[int]:
    rng, cu = random.Random(1), [0, total // 3]
    while cu[-1] < total:
        cu.append(min(total, cu[-1] + rng.randint(50, 400)))
    return cu


def _lognormal(total: int, seed: int = 2) -> list[int]:
    """A long tail as in real corpora: median ~665 tokens, a few documents of 10k+."""
    rng, cu = random.Random(seed), [0]
    while cu[-1] < total:
        cu.append(min(total, cu[-1] + max(1, int(rng.lognormvariate(6.5, 1.2)))))
    return cu


ROWS = {
    "sweep_32k": _sweep(32768),
    "sweep_128k": _sweep(131072),
    "long_among_short_32k": _long_among_short(32768),
    "lognormal_128k": _lognormal(131072),
}


def _auto_rule(report: dict) -> str:
    """auto's layout from the report's predicted times on a new packing: the fastest of the
    other layouts where it beats the zigzag's best by AUTO_MARGIN, else the zigzag."""
    best = {k: min(v["kernels_new_packing"].values()) for k, v in report["layouts"].items() if v}
    other = min((k for k in best if k != "zigzag"), key=best.get)
    return other if best[other] < best["zigzag"] * (1 - AUTO_MARGIN) else "zigzag"


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("row", sorted(ROWS))
def test_documents_layout_spread_at_most_1_10(row, n):
    report = document_work(ROWS[row], n, causal=True)
    docs_spread = report["layouts"][DOCUMENTS]["spread"]
    assert docs_spread <= 1.10, (row, n, docs_spread)
    zigzag = report["layouts"]["zigzag"]["spread"]
    # auto follows the predicted time of the slowest rank, not the spread (test_packed_cost.py)
    assert report["auto"] == _auto_rule(report), report["choices"]
    assert report["layout"] == "zigzag" and report["spread"] == zigzag  # the default: unchanged
    # the pairs are the documents' own, in either layout
    lengths = [b - a for a, b in zip(ROWS[row], ROWS[row][1:], strict=False)]
    assert report["layouts"][DOCUMENTS]["pairs_total"] == sum(x * (x + 1) // 2 for x in lengths)


def test_a_measured_row_balanced_by_documents_but_auto_weighs_time():
    """The documents layout evens the pairs of a measured row (spread 1.84 -> 1.01), but its 7
    documents cut in 16 pieces each cost more time than the imbalance (short pieces, 2 varlen
    calls per block, no block skipped): auto keeps the row's zigzag; asked, it cuts documents."""
    cu = [0, 1000, 9000, 9500, 20000, 26000, 30000, 32768]
    report = document_work(cu, 8, causal=True)
    assert report["layouts"]["zigzag"]["spread"] > 1.7
    times = {k: v["predicted_ms"] for k, v in report["layouts"].items()}
    assert times[DOCUMENTS] > times["zigzag"] and report["auto"] == _auto_rule(report)
    asked = document_work(cu, 8, layout=DOCUMENTS)
    assert asked["layout"] == DOCUMENTS and asked["spread"] <= 1.01


def test_short_documents_keep_the_row_zigzag():
    """Documents inside one chunk: the row's zigzag is balanced and skips transfers; auto keeps
    it (the documents layout would move every query)."""
    report = document_work(list(range(0, 65, 4)), 4, causal=True)
    assert report["auto"] == "zigzag"
    docs_q = sum(r["q_transfers"] for r in report["layouts"][DOCUMENTS]["ranks"])
    assert sum(r["q_transfers"] for r in report["ranks"]) < docs_q


# --- kernels: a query piece against two key pieces of its document ----------------------------


def test_segments_pair_merges_a_query_piece_met_twice():
    """The block of a documents-layout diagonal: q piece back x key front (full) and x key back
    (causal) give one query run two partials; the per-segment kernel merges them."""
    plan = doc_plan(Documents((0, 7, 9, 16)), CAUSAL_ZIGZAG, (8, 8), DOCUMENTS)
    gen = torch.Generator().manual_seed(4)
    for segs in (plan.block(0, 0), plan.block(1, 0), plan.block(0, 1), plan.block(1, 1)):
        assert segs
        for layout in (BSHD, BHSD):
            shape = (2, 8, 3, 8) if layout is BSHD else (2, 3, 8, 8)  # any tile fits in 8
            q, do = (torch.randn(shape, generator=gen, dtype=torch.float64) for _ in "qo")
            k, v = (torch.randn(shape, generator=gen, dtype=torch.float64) for _ in "kv")
            results = []
            for pair in (segments_pair(PAIRS["math"]), MASKED):
                out, lse = pair.forward(q, k, v, 0.3, layout, segs)
                delta = (layout.to_bhsd(do) * layout.to_bhsd(out)).sum(-1)
                grads = pair.backward(do, q, k, v, None, lse, delta, 0.3, layout, segs)
                results.append((out, lse, *grads))
            for a, b in zip(*results, strict=True):  # lse is fp32 (the kernel contract)
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_runs_join_interleaved_segments():
    """Front causal pieces, then back pieces each meeting a front (full) and its own back
    (causal) key piece: two runs, however the segments interleave (the diagonal pieces abut
    all along: one causal varlen call; the back x front rectangles another)."""
    segs = (
        Segment(0, 2, 0, 2, True), Segment(2, 4, 2, 4, True),
        Segment(4, 5, 0, 2, False), Segment(4, 5, 4, 5, True),
        Segment(5, 8, 2, 4, False), Segment(5, 8, 5, 8, True),
    )  # fmt: skip
    runs = segment_runs(segs)
    assert sorted((g[0].q0, g[0].k0, len(g)) for g in runs) == [(0, 0, 4), (4, 0, 2)]


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("causal", [True, False])
def test_thread_ring_per_segment_kernel_matches_exact(n, causal):
    """Every rank's real loops (threads of one process) in the documents layout with a dense
    kernel called once per segment, whose second partial of a query piece is merged (the GPU
    fallback's path; the CPU's own kernel is `masked`): fp64 out, dq, dk, dv equal exact ones."""
    from tests.thread_ring import run_ring
    from tokenring_xdit.ring.training.backward import block_backward
    from tokenring_xdit.ring.training.forward import BlockCall, block_forward
    from tokenring_xdit.ring.split.sharding import shard_positions

    total, h, d = 2 * n * 7, 2, 8
    docs = Documents((0, 1, 9, 10, 23, total))  # lengths 1, 8, 1, 13, ...: none divides by 2N
    doc = torch.tensor([docs.doc_at(i) for i in range(total)])
    allowed = doc[:, None] == doc[None, :]
    if causal:
        allowed &= torch.ones(total, total, dtype=torch.bool).tril()
    gen = torch.Generator().manual_seed(n)
    q, k, v, do = (torch.randn(1, total, h, d, generator=gen, dtype=torch.float64) for _ in "qkvo")
    ins = [x.clone().requires_grad_() for x in (q, k, v)]
    scores = (ins[0].transpose(1, 2) @ ins[1].permute(0, 2, 3, 1)) * d**-0.5
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)
    ref_out = (probs @ ins[2].transpose(1, 2)).transpose(1, 2)
    ref_out.backward(do)
    schedule = CAUSAL_ZIGZAG if causal else NON_CAUSAL_BLOCKS
    q_lens = (total // n,) * n
    plan = doc_plan(docs, schedule, q_lens, DOCUMENTS)
    call = BlockCall(schedule, segments_pair(PAIRS["math"]), BSHD, d**-0.5, plan)
    pos = [shard_positions(total, r, n, causal=causal, cu_seqlens=docs.bounds,
                           layout=DOCUMENTS) for r in range(n)]  # fmt: skip

    def rank_fn(ring):
        ql, kl, vl, dol = (x[:, pos[ring.rank]].contiguous() for x in (q, k, v, do))
        out, lse = block_forward(call, ring, q_lens, ql, kl, vl)
        return [out, *block_backward(call, ring, q_lens, dol, ql, kl, vl, out, lse)]

    results = run_ring(n, rank_fn)
    for i, want in enumerate((ref_out, *(x.grad for x in ins))):
        for r, res in enumerate(results):
            torch.testing.assert_close(res[i], want[:, pos[r]].detach(), rtol=1e-5, atol=1e-5)
