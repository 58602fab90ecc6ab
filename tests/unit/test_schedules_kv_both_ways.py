"""The K/V family's table (ring/schedules/kv_both_ways.py), without any process group: every rank
meets every half once, every transfer has its receiver, every dK/dV sum passes every holder and
ends at home, and the blocks cover the (causal) attention exactly once, balanced."""

from __future__ import annotations

import itertools

import pytest

from tokenring_xdit.ring.schedules.blocks import FRONT, part_slice
from tokenring_xdit.ring.schedules.kv_both_ways import (
    A,
    B,
    front_len,
    half_ranges,
    kv_steps,
    split_by_heads,
)

RINGS = [1, 2, 3, 4, 5, 8]


@pytest.mark.parametrize("n", RINGS)
@pytest.mark.parametrize("causal", [True, False])
def test_every_rank_holds_every_half_once(n, causal):
    for r in range(n):
        rows = kv_steps(r, n, causal)
        assert rows[0].diagonal and rows[0].kernel
        assert len(rows) == n + (n > 1) and not any(st.kernel for st in rows[n:])
        for h in (A, B):
            owners = [st.halves[h].owner for st in rows[1:n]]
            assert sorted(owners) == [j for j in range(n) if j != r], (r, h, owners)


@pytest.mark.parametrize("n", RINGS)
def test_each_half_travels_one_way_one_hop_a_step(n):
    for r, (h, ahead) in itertools.product(range(n), ((A, 1), (B, -1))):
        for st in kv_steps(r, n, False):
            row = st.halves[h]
            if row.send_to is None:
                continue
            assert row.send_to == (r + ahead) % n != r or n == 1
            peer = kv_steps(row.send_to, n, False)[st.step].halves[h]
            assert peer.recv_from == r and peer.recv_owner == row.owner
            # what arrives is what the receiver holds at the next step
            assert kv_steps(row.send_to, n, False)[st.step + 1].halves[h].owner == row.owner


@pytest.mark.parametrize("n", RINGS)
def test_each_grad_sum_passes_every_holder_and_ends_home(n):
    """The sum of a half's dK/dV: started by its first holder (step 1), carried one hop a step
    one step behind the half, each holder adding its block, home at row N."""
    for j, h in itertools.product(range(n), (A, B)):
        ahead = 1 if h == A else -1
        path = []  # (row, sender, receiver) of the sum of KV_j's half h
        for r in range(n):
            rows = kv_steps(r, n, False)
            for s, st in enumerate(rows):
                row = st.halves[h]
                if row.grad_send_to is None:
                    continue
                sent_owner = rows[s - 1].halves[h].owner  # the sum made at the previous row
                peer = kv_steps(row.grad_send_to, n, False)[s].halves[h]
                assert peer.grad_recv_from == r and peer.grad_owner == sent_owner
                if sent_owner == j:
                    path.append((s, r, row.grad_send_to))
        path.sort()
        assert [s for s, _, _ in path] == list(range(2, n + 1))
        assert [src for _, src, _ in path] == [(j + ahead * s) % n for s in range(1, n)]
        assert path == [] or path[-1][2] == j  # the last hop ends at the owner


def _zigzag_positions(n: int, chunk: int) -> list[list[int]]:
    return [
        list(range(r * chunk, (r + 1) * chunk))
        + list(range((2 * n - 1 - r) * chunk, (2 * n - r) * chunk))
        for r in range(n)
    ]


def _half_positions(pos: list[int], half: int, causal: bool, by_heads: bool, part: str):
    ranges = half_ranges(len(pos), causal, by_heads)[half]
    tokens = [pos[i] for a, b in ranges for i in range(a, b)]
    if part == FRONT:
        tokens = tokens[: front_len(len(pos), half, causal, by_heads)]
    return tokens


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("by_heads", [True, False])
@pytest.mark.parametrize("chunk", [4, 5, 1])
@pytest.mark.parametrize("causal", [True, False])
def test_blocks_cover_attention_once_balanced(n, by_heads, chunk, causal):
    """Per head group (a half's query heads; token halves: all heads), every (query, key) pair
    the mask allows is in exactly one block; no off-diagonal block holds a masked pair; every
    rank's blocks at a step have the same area."""
    pos = _zigzag_positions(n, chunk)
    length = 2 * chunk
    seen = {}
    for r in range(n):
        areas = []
        for st in kv_steps(r, n, causal)[:n]:
            if st.diagonal:
                for qi, ki in itertools.product(range(length), repeat=2):
                    if not causal or ki <= qi:
                        for g in (A, B):
                            key = (g, pos[r][qi], pos[r][ki])
                            seen[key] = seen.get(key, 0) + 1
                continue
            area = 0
            for h in (A, B):
                row = st.halves[h]
                qs = [pos[r][i] for i in range(length)[part_slice(row.q_part, length)]]
                ks = _half_positions(pos[row.owner], h, causal, by_heads, row.kv_part)
                area += len(qs) * len(ks)
                for qg, kg in itertools.product(qs, ks):
                    assert not causal or kg <= qg, (r, st.step, h, qg, kg)
                    for g in (h,) if by_heads else (A, B):
                        seen[(g, qg, kg)] = seen.get((g, qg, kg), 0) + 1
            areas.append(area)
        if r == 0:
            first = areas
        assert areas == first, (r, areas, first)
    total = 2 * n * chunk
    want = {
        (g, qg, kg): 1
        for g in (A, B)
        for qg, kg in itertools.product(range(total), repeat=2)
        if not causal or kg <= qg
    }
    assert seen == want


def test_split_by_heads_only_when_they_pair_up():
    assert [split_by_heads(h) for h in (1, 2, 3, 4, 8)] == [False, True, False, True, True]
