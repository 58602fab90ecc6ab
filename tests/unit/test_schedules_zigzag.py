"""The causal zigzag block schedule (and the lifted non-causal one), checked as a whole ring
without a process group: every (query, key) pair the causal mask allows is computed exactly once,
work is balanced, transfers pair up, no self-sends, N-1 of each per pass."""

from __future__ import annotations

import pytest

from tokenring_xdit.ring.schedules import CAUSAL_ZIGZAG, NON_CAUSAL_BLOCKS
from tokenring_xdit.ring.schedules.blocks import ALL, BACK, FRONT

SIZES = range(1, 9)


def _chunks(rank, n, part):
    """Global chunk ids (of 2N) a part of rank's zigzag shard covers."""
    return {ALL: [rank, 2 * n - 1 - rank], FRONT: [rank], BACK: [2 * n - 1 - rank]}[part]


@pytest.mark.parametrize("n", SIZES)
def test_causal_blocks_cover_the_mask_exactly_once(n):
    seen = {}
    for r in range(n):
        for st in CAUSAL_ZIGZAG.block_steps(r, n):
            if not st.kernel:
                continue
            for qc in _chunks(st.q_owner, n, st.q_part):
                for kc in _chunks(r, n, st.kv_part):
                    if kc <= qc:  # the diagonal block masks (r, 2N-1-r) away itself
                        seen[(qc, kc)] = seen.get((qc, kc), 0) + 1
                    # an unmasked block must hold no future keys
                    assert st.causal or kc < qc, (n, r, st, "a block with future keys")
    needed = {(qc, kc) for qc in range(2 * n) for kc in range(qc + 1)}
    assert set(seen) == needed and set(seen.values()) == {1}, (n, seen)


@pytest.mark.parametrize("n", SIZES)
def test_causal_work_is_balanced(n):
    for r in range(n):
        for st in CAUSAL_ZIGZAG.block_steps(r, n)[1:n]:
            # (half Q x all K/V) or (all Q x half K/V): 2 chunk pairs per step on every rank
            pairs = len(_chunks(st.q_owner, n, st.q_part)) * len(_chunks(r, n, st.kv_part))
            assert pairs == 2, (n, r, st)


@pytest.mark.parametrize("schedule", [CAUSAL_ZIGZAG, NON_CAUSAL_BLOCKS], ids=lambda s: s.name)
@pytest.mark.parametrize("n", SIZES)
def test_transfers_pair_up_without_self_sends(schedule, n):
    plans = [schedule.block_steps(r, n) for r in range(n)]
    for r, plan in enumerate(plans):
        assert [st.step for st in plan] == list(range(n + (n > 1)))
        assert sum(st.kernel for st in plan) == n
        assert sum(st.q_send_to is not None for st in plan) == n - 1
        assert sum(st.ret_send_to is not None for st in plan) == n - 1
        for st in plan:
            assert r not in (st.q_send_to, st.q_recv_from, st.ret_send_to, st.ret_recv_from)
            if st.q_send_to is not None:
                peer = plans[st.q_send_to][st.step]
                assert peer.q_recv_from == r and peer.q_recv_part == st.q_send_part
                assert peer.q_recv_owner == st.q_owner
                nxt = plans[st.q_send_to][st.step + 1]
                assert (nxt.q_owner, nxt.q_part) == (st.q_owner, st.q_send_part)
                # only a part of what is held can be sent
                assert st.q_part == ALL or st.q_send_part == st.q_part
            if st.ret_send_to is not None:
                computed = plan[st.step - 1]
                assert st.ret_send_to == computed.q_owner
                assert st.ret_send_part == computed.q_part
                peer = plans[st.ret_send_to][st.step]
                assert peer.ret_recv_from == r and peer.ret_recv_part == st.ret_send_part


def test_only_the_back_half_travels_after_the_wrap():
    n = 4
    sends = {
        (r, st.step): st.q_send_part
        for r in range(n)
        for st in CAUSAL_ZIGZAG.block_steps(r, n)
        if st.q_send_to is not None
    }
    assert all(part == BACK for (r, _), part in sends.items() if r == 0), sends
    assert sends[(3, 0)] == ALL and sends[(3, 1)] == BACK  # Q_3 full to 2; Q_0.b to 2
