"""A sliding window through the training loops (forward and backward) on a thread ring: exact
against fp64 attention of the whole sequence under the window's mask, and the loops run what the
window plan predicts (kernels, Q posts, returns, rows carried), nothing more."""

from __future__ import annotations

import pytest

from tests.window_ring import window_case
from tokenring_xdit.ring.packed.window_traffic import plan_traffic

TOL = (
    2e-5  # fp64 inputs; partials merge in fp32 and lse is fp32 (as tests/unit/test_thread_ring.py)
)

# (ring, causal, split, local length, window): windows inside a shard, over several, past the row
CASES = [
    (1, True, "zigzag", 8, (2, 0)),
    (2, True, "zigzag", 8, (3, 0)),
    (3, True, "zigzag", 8, (9, 0)),
    (4, True, "zigzag", 8, (1, 0)),
    (4, True, "zigzag", 8, (100, 0)),
    (2, True, "contiguous", 8, (4, 0)),
    (3, True, "contiguous", 8, (12, 0)),
    (4, True, "contiguous", 6, (0, 0)),
    (2, False, "zigzag", 8, (3, 3)),
    (3, False, "zigzag", 6, (-1, 2)),
    (4, False, "zigzag", 6, (7, -1)),
    (4, False, "zigzag", 4, (2, 5)),
]


@pytest.mark.parametrize("n, causal, split, local, window", CASES)
def test_window_is_exact_and_runs_the_plan(n, causal, split, local, window):
    errs, counts, plan = window_case(n, causal, split, local, window)
    assert max(errs.values()) <= TOL, errs
    steps = plan_traffic(plan, (local,) * n)
    # both passes run the same blocks and transfers
    assert counts["kernels"] == 2 * sum(s.kernels for s in steps)
    assert counts.get("q", 0) == 2 * sum(s.q_posts for s in steps)
    assert counts.get("partial", 0) == 2 * sum(s.ret_posts for s in steps)
    full = n * n  # kernels per pass without a window
    if window[0] != -1 and window[0] + 1 < local // 2 and n > 2:
        assert sum(s.kernels for s in steps) < full  # a narrow window skips blocks


@pytest.mark.parametrize("n, causal, split", [(2, True, "zigzag"), (3, True, "contiguous"),
                                              (3, False, "zigzag")])  # fmt: skip
def test_window_with_packed_documents_and_gqa(n, causal, split):
    local = 12
    bounds = (0, 5, 19, 20, 12 * n)
    errs, counts, plan = window_case(n, causal, split, local, (4, 0 if causal else 2),
                                     bounds=bounds, h=4, h_kv=2)  # fmt: skip
    assert max(errs.values()) <= TOL, errs
    steps = plan_traffic(plan, (local,) * n)
    assert counts["kernels"] == 2 * sum(s.kernels for s in steps)


def test_contiguous_window_carries_only_the_rows_it_reaches():
    """Causal contiguous shards of 16, a window of 4 tokens: each query goes one hop, carrying
    its first 3 rows (the only ones that see the previous shard), and 3 rows come home."""
    n, local = 4, 16
    errs, counts, plan = window_case(n, True, "contiguous", local, (3, 0))
    assert max(errs.values()) <= TOL, errs
    assert counts["kernels"] == 2 * (n + n - 1)  # the diagonals and one neighbour each
    assert counts["q"] == 2 * (n - 1) and counts["tokens_q"] == 2 * (n - 1) * 3
    assert counts["partial"] == 2 * (n - 1) and counts["tokens_partial"] == 2 * (n - 1) * 3


def test_zigzag_window_skips_middle_steps():
    """Zigzag of 4, a window inside a chunk: step 2 meets only pairs two chunks apart, so no
    rank runs a kernel there (the back halves still travel on to their neighbour at step 3)."""
    errs, counts, plan = window_case(4, True, "zigzag", 8, (2, 0))
    assert max(errs.values()) <= TOL, errs
    kernels = [s.kernels for s in plan_traffic(plan, (8,) * 4)]
    assert kernels == [4, 3, 0, 3, 0]
    assert counts["kernels"] == 2 * 10
