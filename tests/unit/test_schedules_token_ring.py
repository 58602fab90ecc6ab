"""The TokenRing schedule table, checked as a whole ring (no process group needed)."""

from __future__ import annotations

from collections import Counter

import pytest

from tokenring_xdit.ring.schedules.token_ring import chunk_bounds, final_return, steps

SIZES = range(1, 9)


def _plans(n: int):
    return [steps(r, n) for r in range(n)]


@pytest.mark.parametrize("n", SIZES)
def test_one_step_per_ring_rank_in_order(n):
    for r, plan in enumerate(_plans(n)):
        assert [st.step for st in plan] == list(range(n)), (n, r)


@pytest.mark.parametrize("n", SIZES)
def test_every_q_visits_every_rank_once(n):
    plans = _plans(n)
    for r, plan in enumerate(plans):
        owners = [st.q_owner for st in plan]
        assert sorted(owners) == list(range(n)), f"N={n} rank {r} runs Q of {owners}"
        assert owners[0] == r, f"N={n} rank {r} must start with its own Q, got {owners[0]}"
    # Seen from the Q's side: Q_j is computed on every rank exactly once.
    for j in range(n):
        hosts = [r for r, plan in enumerate(plans) for st in plan if st.q_owner == j]
        assert sorted(hosts) == list(range(n)), f"N={n}: Q_{j} computed on ranks {hosts}"
    # At each step the ring holds every Q exactly once (a permutation across ranks).
    for s in range(n):
        held = [plans[r][s].q_owner for r in range(n)]
        assert sorted(held) == list(range(n)), f"N={n} step {s}: Qs held {held}"


@pytest.mark.parametrize("n", SIZES)
def test_q_sends_and_recvs_pair_up(n):
    plans = _plans(n)
    for s in range(n):
        for r in range(n):
            st = plans[r][s]
            if st.q_send_to is not None:
                peer = plans[st.q_send_to][s]
                assert peer.q_recv_from == r, f"N={n} s={s}: {r} sends Q to {st.q_send_to}"
                # The receiver expects the Q that the sender holds, and computes it next step.
                assert peer.q_recv_owner == st.q_owner, (n, s, r)
                assert plans[st.q_send_to][s + 1].q_owner == st.q_owner, (n, s, r)
            if st.q_recv_from is not None:
                assert plans[st.q_recv_from][s].q_send_to == r, (n, s, r)
            assert (st.q_send_to is None) == (st.q_recv_from is None), (n, s, r)
            assert (st.q_recv_owner is None) == (st.q_recv_from is None), (n, s, r)


@pytest.mark.parametrize("n", SIZES)
def test_partial_returns_pair_up(n):
    plans = _plans(n)
    for s in range(n):
        for r in range(n):
            st = plans[r][s]
            if st.ret_send_to is not None:
                peer = plans[st.ret_send_to][s]
                assert peer.ret_recv_from == r, f"N={n} s={s}: {r} returns to {st.ret_send_to}"
            if st.ret_recv_from is not None:
                assert plans[st.ret_recv_from][s].ret_send_to == r, (n, s, r)
            assert (st.ret_send_to is None) == (st.ret_recv_from is None), (n, s, r)
    for r in range(n):
        fr = final_return(r, n)
        if n == 1:
            assert fr is None
            continue
        send_to, recv_from = fr
        assert final_return(send_to, n)[1] == r, f"N={n}: final return {r}->{send_to} unmatched"
        assert final_return(recv_from, n)[0] == r, f"N={n}: final recv {r}<-{recv_from}"
        # The final partial belongs to the Q held at the last step.
        assert send_to == plans[r][n - 1].q_owner, (n, r)


@pytest.mark.parametrize("n", SIZES)
def test_every_partial_goes_home_exactly_once(n):
    plans = _plans(n)
    delivered: Counter = Counter()  # (owner j, computed on r) -> deliveries to j
    for r, plan in enumerate(plans):
        for st in plan:
            if st.ret_send_to is not None:
                # What is sent at step s was computed at step s-1 on this rank.
                owner = plan[st.step - 1].q_owner
                assert st.ret_send_to == owner, f"N={n} r={r} s={st.step}: P({owner},{r}) misrouted"
                delivered[(owner, r)] += 1
                # The receiver sees it as its own partial from r.
                assert plans[owner][st.step].ret_recv_from == r
        fr = final_return(r, n)
        if fr is not None:
            owner = plan[-1].q_owner
            assert fr[0] == owner
            delivered[(owner, r)] += 1
    expected = Counter({(j, r): 1 for j in range(n) for r in range(n) if j != r})
    assert delivered == expected, f"N={n}: deliveries {dict(delivered)}"
    # P(r, r) never leaves its rank.
    assert all(j != r for j, r in delivered), delivered


@pytest.mark.parametrize("n", SIZES)
def test_each_rank_receives_each_foreign_partial_once(n):
    for r, plan in enumerate(_plans(n)):
        sources = [st.ret_recv_from for st in plan if st.ret_recv_from is not None]
        fr = final_return(r, n)
        if fr is not None:
            sources.append(fr[1])
        assert sorted(sources) == [x for x in range(n) if x != r], f"N={n} r={r}: {sources}"


@pytest.mark.parametrize("n", SIZES)
def test_no_self_sends_and_totals(n):
    for r, plan in enumerate(_plans(n)):
        peers = []
        for st in plan:
            peers += [st.q_send_to, st.q_recv_from, st.ret_send_to, st.ret_recv_from]
        fr = final_return(r, n)
        if fr is not None:
            peers += list(fr)
        assert r not in peers, f"N={n} rank {r} talks to itself: {plan}, final {fr}"
        q_sends = sum(st.q_send_to is not None for st in plan)
        q_recvs = sum(st.q_recv_from is not None for st in plan)
        returns = sum(st.ret_send_to is not None for st in plan) + (fr is not None)
        ret_recvs = sum(st.ret_recv_from is not None for st in plan) + (fr is not None)
        assert (q_sends, q_recvs, returns, ret_recvs) == (n - 1,) * 4, (n, r)


def test_single_rank_has_no_communication():
    (st,) = steps(0, 1)
    assert st.q_owner == 0
    assert (st.q_send_to, st.q_recv_from, st.q_recv_owner) == (None, None, None)
    assert (st.ret_send_to, st.ret_recv_from) == (None, None)
    assert final_return(0, 1) is None


def test_last_step_has_no_q_traffic_and_first_two_no_returns():
    for n in range(2, 9):
        for r in range(n):
            plan = steps(r, n)
            assert plan[-1].q_send_to is None and plan[-1].q_recv_from is None
            assert all(st.ret_send_to is None for st in plan[:2]), (n, r)


@pytest.mark.parametrize("rank,n", [(-1, 2), (2, 2), (0, 0), (5, 3)])
def test_bad_rank_rejected(rank, n):
    with pytest.raises(ValueError, match="not in a ring"):
        steps(rank, n)


@pytest.mark.parametrize("length", [1, 2, 3, 7, 29, 64, 1000])
@pytest.mark.parametrize("chunks", [1, 2, 3, 4, 5, 8, 100])
def test_chunk_bounds_cover_exactly(length, chunks):
    bounds = chunk_bounds(length, chunks)
    assert len(bounds) == min(chunks, length), (length, chunks, bounds)
    assert bounds[0][0] == 0 and bounds[-1][1] == length, bounds
    for (_, a1), (b0, _) in zip(bounds[:-1], bounds[1:], strict=True):
        assert a1 == b0, f"gap/overlap in {bounds}"
    sizes = [e - s for s, e in bounds]
    assert all(x > 0 for x in sizes), bounds
    assert max(sizes) - min(sizes) <= 1, f"pieces not near-equal: {sizes}"


@pytest.mark.parametrize("chunks", [0, -3])
def test_chunk_bounds_degenerate_counts_give_one_piece(chunks):
    assert chunk_bounds(10, chunks) == [(0, 10)]
