"""The contiguous layout's table (schedules/contiguous.py) and its packed plan (doc_blocks.py):
who holds which query when, what attends, and what travels (the trimmed query prefixes)."""

from __future__ import annotations

import random

import pytest

from tokenring_xdit.ring.packed.doc_split import CONTIGUOUS
from tokenring_xdit.ring.packed import Documents, doc_plan, document_work
from tokenring_xdit.ring.schedules import CAUSAL_CONTIGUOUS, block_schedule
from tokenring_xdit.ring.schedules.blocks import ALL, Rows, part_len


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_the_table_moves_q_to_r_minus_1_and_returns_go_home(n):
    seen = set()
    for r in range(n):
        steps = CAUSAL_CONTIGUOUS.block_steps(r, n)
        assert len(steps) == n + (n > 1)
        for st in steps:
            if st.kernel:
                assert st.q_owner == (r + st.step) % n and st.causal == (st.step == 0)
                assert (st.q_part, st.kv_part) == (ALL, ALL)
                seen.add((st.q_owner, r))
            if st.q_send_to is not None:  # the next holder of the query we hold is r - 1
                assert st.q_send_to == (r - 1) % n and st.q_recv_from == (r + 1) % n
                assert st.q_recv_owner == (r + st.step + 1) % n
            if st.ret_send_to is not None:  # the previous step's partial goes to its owner
                assert st.ret_send_to == (r + st.step - 1) % n != r
                assert st.ret_recv_from == (r - st.step + 1) % n != r
    assert seen == {(j, r) for j in range(n) for r in range(n)}
    assert block_schedule(True, CONTIGUOUS) is CAUSAL_CONTIGUOUS


def test_a_crossing_document_sends_only_its_rows():
    """N = 2, 8 tokens a shard, documents [0, 5), [5, 13), [13, 16): the middle one reaches from
    shard 0 into the first 5 rows of shard 1. Rank 0 meets exactly those 5 rows of Q1 at step 1;
    Q1 travels trimmed to them, its partial comes home as 5 rows; Q0 never travels (no later
    shard precedes it)."""
    plan = doc_plan(Documents((0, 5, 13, 16)), CAUSAL_CONTIGUOUS, (8, 8), CONTIGUOUS)
    seg = plan.block(0, 1)
    assert [(s.q0, s.q1, s.k0, s.k1, s.causal) for s in seg] == [(0, 5, 5, 8, False)]
    assert plan.block(1, 1) == ()  # Q0 at rank 1: keys after its queries
    r0, r1 = plan.steps
    assert r0[1].q_part == Rows(5) and r0[0].q_recv_part == Rows(5)
    assert r1[0].q_send_part == Rows(5) and plan.transfers(1)[0][0]  # Q1 goes, 5 rows
    assert not plan.transfers(0)[0][0]  # Q0 stays
    assert r1[2].ret_recv_part == Rows(5) and r0[2].ret_send_part == Rows(5)
    report = document_work([0, 5, 13, 16], 2, layout=CONTIGUOUS)
    assert [r["q_transfers"] for r in report["ranks"]] == [0, 1]
    # rank 0: its 15 + 6 causal pairs and 5 queries x 3 keys of the crossing one; rank 1: 15 + 6
    assert [r["pairs"] for r in report["ranks"]] == [15 + 6 + 15, 15 + 6]


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_what_travels_is_the_prefix_later_holders_attend(n):
    """Random rows: every step's held part covers the rows its kernel reads and is the longest
    prefix any later holder needs (never more: nothing travels that no one reads)."""
    rng = random.Random(n)
    for _ in range(30):
        length = rng.randint(1, 12)
        total = n * length
        cuts = sorted(rng.sample(range(1, total), min(total - 1, rng.randint(0, 6))))
        plan = doc_plan(Documents((0, *cuts, total)), CAUSAL_CONTIGUOUS, (length,) * n, CONTIGUOUS)
        used = {}
        for r in range(n):
            for st in plan.steps[r][:n]:
                segs = plan.block(r, st.step)
                used[(st.q_owner, st.step)] = max((s.q1 for s in segs), default=0)
                if st.step and segs:
                    assert part_len(st.q_part, length) >= used[(st.q_owner, st.step)]
        for r in range(n):
            for st in plan.steps[r][1:n]:
                later = max(used[(st.q_owner, t)] for t in range(st.step, n))
                assert part_len(st.q_part, length) == later
