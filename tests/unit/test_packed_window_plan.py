"""The window plan: every visible pair of the whole sequence (window, causality, documents) is
covered by exactly one block's mask, in every layout; skipped blocks and stopped queries."""

from __future__ import annotations

import random

import pytest
import torch

from tests.window_ring import positions, window_mask
from tokenring_xdit.ring.kernels import segments_mask
from tokenring_xdit.ring.packed import Documents
from tokenring_xdit.ring.packed.window_plan import window_plan
from tokenring_xdit.ring.packed.window_traffic import window_traffic
from tokenring_xdit.ring.schedules.blocks import ALL, Rows, part_slice
from tokenring_xdit.ring.schedules.window import Window


def _tile(pos: list[int], part) -> list[int]:
    return pos[part_slice(ALL if isinstance(part, Rows) else part, len(pos))]


@pytest.mark.parametrize("seed", range(6))
def test_plan_covers_each_visible_pair_exactly_once(seed):
    rng = random.Random(seed)
    for _ in range(60):
        n, causal = rng.randint(1, 4), rng.random() < 0.6
        split = rng.choice(["zigzag", "contiguous", "documents"] if causal else
                           ["zigzag", "documents"])  # fmt: skip
        total = 2 * n * rng.randint(1, 5)
        bounds = None
        if rng.random() < 0.5 or split == "documents":
            cuts = rng.sample(range(1, total), rng.randint(0, min(5, total - 1)))
            bounds = (0, *sorted(cuts), total)
        size = (rng.choice([-1, 0, 1, 2, 3, 5, 8, 40]), rng.choice([-1, 0, 1, 2, 5, 40]))
        window = Window.of(size, causal)
        if window is None:
            continue
        docs = Documents(bounds) if bounds else None
        plan = window_plan(window, causal, (total // n,) * n, split, docs)
        pos = positions(total, n, causal, split, bounds)
        seen = torch.zeros(total, total, dtype=torch.int64)
        for r in range(n):
            for st in plan.steps[r][:n]:
                mask = plan.block(r, st.step)
                if mask == ():
                    continue
                qt = torch.tensor(_tile(pos[st.q_owner], st.q_part))
                kt = torch.tensor(_tile(pos[r], st.kv_part))
                seen[qt[:, None], kt[None, :]] += segments_mask(mask, len(qt), len(kt), "cpu")
        want = window_mask(total, size, causal, bounds)
        assert torch.equal(seen, want.long()), (n, causal, split, bounds, size)


def test_blocks_the_window_leaves_alone_keep_the_causal_flag():
    """A window wider than the row changes no block: the call's own kernel runs them all."""
    plan = window_plan(Window(10_000, 0), True, (8, 8, 8), "zigzag")
    for r in range(3):
        assert [plan.block(r, t) for t in range(3)] == [True, False, False]


def test_contiguous_query_stops_after_the_window():
    """Causal contiguous shards of 64, window of 100 tokens: a query needs the 2 shards before
    it, so it travels 2 hops (100 - 1 rows the first, 99 - 64 the second) and then stops."""
    got = window_traffic(6, 64, (99, 0), True, "contiguous", q_token_bytes=1)
    assert got["steps_run"] == 3
    assert [s["q_bytes"] for s in got["per_step"][:2]] == [64, 35]
    assert all(s["q_bytes"] == 0 for s in got["per_step"][2:])


def test_traffic_without_a_window_is_the_whole_table():
    got = window_traffic(4, 32, (-1, -1), True, "zigzag")
    assert got["steps_run"] == 4 and got["kernels"] == 16


def test_one_document_in_the_documents_layout_runs_the_zigzag_window():
    """One document of 64 over ring 4 is cut in the 8 pieces of the zigzag's chunks: a causal
    window of 3 (inside a piece) runs the same 10 of the 16 blocks as the dense zigzag (the
    table in schedules/window.py) and stops the same transfers."""
    size, lens = Window(2, 0), (16,) * 4
    docs = window_plan(size, True, lens, "documents", Documents((0, 64)))
    dense = window_plan(size, True, lens, "zigzag")
    for plan in (docs, dense):
        runs = sum(plan.attends(r, st.step) for r in range(4) for st in plan.steps[r][:4])
        assert runs == 10
    assert [docs.transfers(r) for r in range(4)] == [dense.transfers(r) for r in range(4)]


def test_documents_layout_window_inside_pieces_skips_what_the_documents_keep():
    """Two documents of 32 over ring 2 (pieces of 8), causal window of 3: a piece sees its own
    and the neighbouring piece of its document only; the block of rank 0's back half (pieces 3)
    against rank 1's keys keeps the corners of pieces 2 | 3 alone, one per document."""
    plan = window_plan(Window(2, 0), True, (32, 32), "documents", Documents((0, 32, 64)))
    st = plan.steps[1][1]
    assert (st.q_owner, st.q_part, st.kv_part) == (0, "back", "all")
    corners = plan.block(1, 1)
    assert len(corners) == 2 and all(s.band is not None for s in corners), corners
    assert all((s.q1 - s.q0, s.k1 - s.k0) == (2, 2) for s in corners), corners


def test_documents_layout_needs_documents():
    with pytest.raises(ValueError, match="documents"):
        window_plan(Window(3, 0), True, (8, 8), "documents")
