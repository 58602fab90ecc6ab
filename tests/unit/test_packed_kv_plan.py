"""The K/V family's plan (ring/packed/kv_plan.py) without a process group: over random
documents and / or sliding windows, ring 1-4, causal (zigzag) and not (uneven contiguous shards),
halves by heads and by tokens, each rank's blocks cover every visible (query, key) pair of its
queries exactly once (per head half: by heads each half meets every token), and nothing else;
and the plan's rows (`kept_steps`) bring every half to each holder with a block, and every
block's dK/dV home exactly once, with every message received where it is sent."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from tokenring_xdit.ring.packed import Documents
from tokenring_xdit.ring.packed.kv_plan import kv_plan
from tokenring_xdit.ring.schedules.blocks import FRONT, part_slice
from tokenring_xdit.ring.schedules.kv_both_ways import front_len, half_ranges, kv_steps
from tokenring_xdit.ring.schedules.window import Window
from tokenring_xdit.ring.segments import Segment


def _shards(lens: tuple[int, ...], causal: bool) -> list[list[int]]:
    """Each rank's global token positions in its local order."""
    n = len(lens)
    if causal and n > 1:
        c = lens[0] // 2
        return [[*range(r * c, (r + 1) * c), *range((2 * n - 1 - r) * c, (2 * n - r) * c)]
                for r in range(n)]  # fmt: skip
    starts = [sum(lens[:r]) for r in range(n)]
    return [list(range(s, s + x)) for s, x in zip(starts, lens, strict=True)]


def _key_positions(shard: list[int], half: int, part: str, causal: bool, by_heads: bool):
    """The global positions of a held half's `part`, in the order the half travels."""
    keys = [shard[t] for a, b in half_ranges(len(shard), causal, by_heads)[half]
            for t in range(a, b)]  # fmt: skip
    return keys[: front_len(len(shard), half, causal, by_heads)] if part == FRONT else keys


def _pairs(segs, q_pos, k_pos) -> list[tuple[int, int]]:
    """The (query, key) global pairs a block's mask makes visible: segments (a band: its
    rows a and columns b with lo <= a - b <= hi), or the causal flag of the whole block."""
    if isinstance(segs, bool):
        segs = (Segment(0, len(q_pos), 0, len(k_pos), segs),)
    out = []
    for s in segs:
        lo, hi = s.band or (None, None)
        for a in range(s.q0, s.q1):
            for b in range(s.k0, s.k1):
                d = (a - s.q0) - (b - s.k0)
                if (lo is None or d >= lo) and (hi is None or d <= hi) and (not s.causal or d >= 0):
                    out.append((q_pos[a], k_pos[b]))
    return out


def _covered(plan, shards, rank: int, causal: bool, by_heads: bool) -> list[Counter]:
    """Per head half (one Counter for token halves): how often each pair is covered."""
    counts = [Counter(), Counter()] if by_heads else [Counter()]
    mine = shards[rank]
    for c in counts:
        c.update(_pairs(plan.diagonal(rank), mine, mine))
    n = len(shards)
    for st in kv_steps(rank, n, causal)[1:n]:
        for half, row in enumerate(st.halves):
            q_pos = mine[part_slice(row.q_part, len(mine))]
            k_pos = _key_positions(shards[row.owner], half, row.kv_part, causal, by_heads)
            counts[half if by_heads else 0].update(_pairs(plan.block(rank, st.step, half), q_pos,
                                                          k_pos))  # fmt: skip
    return counts


def _expected(docs: Documents, mine: list[int], total: int, causal: bool) -> Counter:
    return Counter((q, k) for q in mine for k in range(total)
                   if docs.doc_at(q) == docs.doc_at(k) and (k <= q or not causal))  # fmt: skip


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("by_heads", [True, False])
def test_every_same_document_pair_is_covered_once(n, causal, by_heads):
    rng = random.Random(1000 * n + 10 * causal + by_heads)
    for _ in range(12):
        if causal:
            lens = (2 * rng.randint(1, 7),) * n
        else:
            lens = tuple(rng.randint(0 if n > 1 else 1, 11) for _ in range(n))
        total = sum(lens)
        if total < 1:
            continue
        cuts = sorted(rng.sample(range(1, total), min(total - 1, rng.randint(0, 6))))
        docs = Documents((0, *cuts, total))
        plan = kv_plan(docs, lens, causal, by_heads)
        shards = _shards(lens, causal)
        for rank in range(n):
            want = _expected(docs, shards[rank], total, causal)
            for got in _covered(plan, shards, rank, causal, by_heads):
                assert got == want, (lens, docs.bounds, rank)
            blocks = sum(bool(plan.block(rank, s, h)) for s in range(1, n) for h in (0, 1))
            assert plan.kernel_calls(rank) == 1 + blocks


def test_off_diagonal_blocks_are_never_masked_and_empty_ones_are_skipped():
    """One document per chunk (ring 3, zigzag): off the diagonal no pair shares a document, so
    every block is empty; one document over everything: every block has one full segment."""
    lens = (4, 4, 4)
    per_chunk = kv_plan(Documents(tuple(range(0, 13, 2))), lens, True, False)
    whole = kv_plan(Documents((0, 12)), lens, True, True)
    for rank in range(3):
        assert per_chunk.kernel_calls(rank) == 1
        assert whole.kernel_calls(rank) == 5
        for s in (1, 2):
            for h in (0, 1):
                segs = whole.block(rank, s, h)
                assert len(segs) == 1 and not segs[0].causal


def _windowed_cases(seed: int):
    """(lens, docs or None, window) at random: windows inside a shard, over several, past the
    row; with and without packed documents; causal zigzag shards and uneven contiguous ones."""
    rng = random.Random(seed)
    for n, causal, by_heads in itertools.product([1, 2, 3, 4], [True, False], [True, False]):
        for _ in range(4):
            lens = (2 * rng.randint(1, 5),) * n if causal else tuple(
                rng.randint(1, 9) for _ in range(n))  # fmt: skip
            total = sum(lens)
            left = rng.choice([0, 1, 2, 5, total // 2, total + 3, -1])
            right = 0 if causal else rng.choice([0, 1, 3, total + 1, -1])
            window = Window.of((left, right), causal)
            cuts = sorted(rng.sample(range(1, total), min(total - 1, rng.randint(0, 4))))
            docs = Documents((0, *cuts, total)) if rng.random() < 0.5 else None
            if window is not None or docs is not None:
                yield n, causal, by_heads, lens, docs, window


def _visible(docs, window, causal: bool, q: int, k: int) -> bool:
    return ((docs is None or docs.doc_at(q) == docs.doc_at(k)) and (not causal or k <= q)
            and (window is None or window.visible(q, k)))  # fmt: skip


def test_every_pair_the_window_shows_is_covered_once():
    for n, causal, by_heads, lens, docs, window in _windowed_cases(7):
        plan = kv_plan(docs, lens, causal, by_heads, window)
        shards, total = _shards(lens, causal), sum(lens)
        for rank in range(n):
            want = Counter((q, k) for q in shards[rank] for k in range(total)
                           if _visible(docs, window, causal, q, k))  # fmt: skip
            for got in _covered(plan, shards, rank, causal, by_heads):
                assert got == want, (lens, docs, window, rank)


def test_the_rows_carry_each_half_and_each_sum_where_the_blocks_need_them():
    """A pure run of every rank's rows: what arrives is what the sender sent at that row; each
    block with a visible pair holds its half; each such block's dK/dV reaches its owner once,
    through holders that each ran a block; no row sends what no later block needs."""
    for n, causal, by_heads, lens, docs, window in _windowed_cases(8):
        plan = kv_plan(docs, lens, causal, by_heads, window)
        rows = [plan.steps(r) for r in range(n)]
        for h in (0, 1):
            held = list(range(n))  # whose half each rank holds
            sums = [None] * n  # per rank: the blocks summed in the sum it made at the last row
            home = Counter()
            for s in range(len(rows[0])):
                sent = {}  # (receiver, kind) -> what
                for r in range(n):
                    row = rows[r][s].halves[h]
                    if row.send_to is not None:
                        sent[(row.send_to, "kv", r)] = held[r]
                    if row.grad_send_to is not None:
                        assert sums[r], (s, r, "a sum without blocks")
                        sent[(row.grad_send_to, "sum", r)] = sums[r]
                made = [None] * n
                for r in range(n):
                    row = rows[r][s].halves[h]
                    if row.recv_from is not None:
                        assert sent.pop((r, "kv", row.recv_from)) == row.recv_owner
                    for src in (row.grad_recv_from, row.home_from):
                        if src is not None:
                            got = sent.pop((r, "sum", src))
                            if src == row.home_from or not rows[r][s].kernel:
                                home.update(got)
                                assert {o for o, _ in got} == {r}
                            else:
                                made[r] = got
                    if 0 < s < n and plan.block(r, s, h) != ():
                        assert held[r] == row.owner, (s, r)
                        made[r] = (made[r] or ()) + ((row.owner, (r, s)),)
                    else:
                        assert made[r] is None, (s, r, "a sum arrived where no block runs")
                    if row.recv_from is not None:
                        held[r] = row.recv_owner
                assert not sent, (s, sent)
                sums = made
            want = Counter((plan.steps(r)[s].halves[h].owner, (r, s)) for r in range(n)
                           for s in range(1, n) if plan.block(r, s, h) != ())  # fmt: skip
            assert home == want, (lens, docs, window, h)
