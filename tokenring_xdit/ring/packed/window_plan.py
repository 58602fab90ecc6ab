"""The plan of a call with a sliding window: packed documents' plan, with the window as one more
reason to skip (the window's value and predicates: schedules/window.py, its note says who does
what).

Per rank and step of the call's block schedule the block's pairs are those of the call without
the window (the schedule's causal flag, or the packed documents' segments) that the window keeps.
Each of those rectangles is cut where its query or key tile jumps in global position (a zigzag
tile is two chunks), and each piece is dropped (no pair visible), kept (all visible) or kept with
its band (`Segment.band`, in the piece's own rows and columns). A block the window leaves alone
stays what it was (the causal flag: the call's dense kernel runs it); an emptied one is skipped,
and `DocPlan`'s transfer table then drops its return and every hop of a query no later holder
needs. On contiguous causal shards a travelling query is also cut to the rows its later holders
reach (`blocks.Rows`), so what travels is bounded by the window, not by the shard.

The documents layout (doc_split.py) runs the same way: its tile is a run per document piece,
the documents' plan gives each block's segments (one piece against one piece, causal on the
diagonal), and the window cuts each against the piece's global positions. A window narrower
than a piece empties the blocks of pieces far apart, and the transfer table stops a query no
later holder needs.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Hashable
from dataclasses import dataclass

from ..schedules import block_schedule
from ..schedules.blocks import BlockStep
from ..schedules.window import ALL_VISIBLE, NONE, Window, band_of, relation
from ..segments import Segment
from .doc_split import CONTIGUOUS, DOCUMENTS, ROW, local_pieces
from .documents import DocPlan, Documents, _local_ranges, _part_ranges, _trimmed, doc_plan

__all__ = ["WindowPlan", "narrowed", "window_plan"]

Mask = bool | tuple[Segment, ...]


@dataclass(frozen=True)
class WindowPlan(DocPlan):
    """A `DocPlan` whose blocks are the window's: a block is the causal flag (untouched by the
    window), segments, or () (skipped). `docs`: the packed documents (None: a dense call)."""

    window: Window | None = None

    @property
    def packing(self) -> Hashable:
        return ("window", tuple(self.window), self.split, self.docs)


@functools.lru_cache(maxsize=64)
def window_plan(
    window: Window, causal: bool, q_lens: tuple[int, ...], split: str = ROW,
    docs: Documents | None = None,
) -> WindowPlan:  # fmt: skip
    """The plan of a call with `window` over shards of `q_lens` tokens cut in layout `split`
    (ring/packed's names: ROW = the zigzag for a causal call, else contiguous shards; CONTIGUOUS:
    contiguous causal shards; DOCUMENTS: every document in 2N pieces, `docs` needed), with
    packed `docs` or dense (None)."""
    n = len(q_lens)
    schedule = block_schedule(causal, split)
    inner = doc_plan(docs, schedule, q_lens, split) if docs is not None else None
    halves = [_halves(r, q_lens, causal, split, docs) for r in range(n)]
    steps = tuple(schedule.block_steps(r, n) for r in range(n))
    segments = tuple(
        tuple(_block(window, st, r, halves, inner) for st in steps[r]) for r in range(n)
    )
    if split == CONTIGUOUS and causal:
        whole = [[_as_segments(m, st, q_lens) for m, st in zip(row, steps[r], strict=True)]
                 for r, row in enumerate(segments)]  # fmt: skip
        steps = _trimmed(steps, whole, n)
    return WindowPlan(docs, n, segments, steps, split, causal, schedule, window=window)


def _as_segments(mask: Mask, st: BlockStep, q_lens) -> tuple[Segment, ...]:
    """A block's segments for the row trimming (a causal flag: the whole contiguous tile)."""
    if not isinstance(mask, bool):
        return mask
    n_q = q_lens[st.q_owner]
    return (Segment(0, n_q, 0, n_q, mask),)  # (only its rows count)


def _halves(rank: int, q_lens, causal: bool, split: str, docs: Documents | None):
    """`rank`'s global ranges in its local order, per half of its shard: a zigzag or documents
    shard's front and back (a documents half: its non-empty pieces, document by document), or
    the one whole of a contiguous shard."""
    if split == DOCUMENTS:
        if docs is None:
            raise ValueError("the documents layout needs the row's documents (cu_seqlens)")
        pieces = local_pieces(docs.bounds, rank, len(q_lens))
        half = len(pieces) // 2
        return [[(g0, g1) for _, _, g0, g1 in part if g1 > g0]
                for part in (pieces[:half], pieces[half:])]  # fmt: skip
    zigzag = causal and len(q_lens) > 1 and split == ROW
    return [[g] for g in _local_ranges(rank, q_lens, zigzag)]


Runs = tuple[list[tuple[int, int, int]], list[int], list[int]]


def _tile_runs(ranges: list[tuple[int, int]]) -> Runs:
    """The runs (t0, t1, g0) of a tile whose global `ranges` come in tile order: rows [t0, t1)
    hold global positions g0, g0 + 1, ...; with the runs' starts and ends (to find a segment's
    runs by bisection)."""
    runs, t = [], 0
    for g0, g1 in ranges:
        runs.append((t, t + g1 - g0, g0))
        t += g1 - g0
    return runs, [run[0] for run in runs], [run[1] for run in runs]


def _meeting(tile: Runs, t0: int, t1: int) -> list[tuple[int, int, int]]:
    """The runs holding some of the tile's rows [t0, t1) (a documents tile has a run per
    document piece: a segment meets one of them)."""
    runs, starts, ends = tile
    return runs[bisect.bisect_right(ends, t0) : bisect.bisect_left(starts, t1)]


def _part(halves, part: str) -> list[tuple[int, int]]:
    """A shard's `part` tile as global ranges in tile order (`halves`: `_halves`)."""
    return [g for half in _part_ranges(halves, part) for g in half]


def _block(window: Window, st: BlockStep, rank: int, halves, inner: DocPlan | None) -> Mask:
    """The block of `rank` at `st`: its mask without the window, narrowed by it."""
    if not st.kernel:
        return ()
    base = st.causal if inner is None else inner.block(rank, st.step)
    return narrowed(window, base, _part(halves[st.q_owner], st.q_part),
                    _part(halves[rank], st.kv_part))  # fmt: skip


def narrowed(window: Window, base: Mask, q_ranges, k_ranges) -> Mask:
    """A block's mask under `window`: `base` is its mask without it (the causal flag of the
    whole tile, or segments), `q_ranges` / `k_ranges` the global token ranges of its query and
    key tiles in tile order. `base` itself where the window hides none of its pairs, else its
    pieces (() : nothing visible, or an empty tile)."""
    q_runs, k_runs = _tile_runs(q_ranges), _tile_runs(k_ranges)
    if not (q_runs[0] and k_runs[0] and q_runs[2][-1] and k_runs[2][-1]):
        return ()
    if isinstance(base, bool):
        segs = (Segment(0, q_runs[2][-1], 0, k_runs[2][-1], base),)
    else:
        segs = base
    out, changed = [], False
    for s in segs:
        for q_run in _meeting(q_runs, s.q0, s.q1):
            for k_run in _meeting(k_runs, s.k0, s.k1):
                piece, same = _piece(window, s, q_run, k_run)
                changed |= not same
                if piece is not None:
                    out.append(piece)
    return tuple(out) if changed else base


def _cut(s0: int, s1: int, run: tuple[int, int, int]) -> tuple[int, int, int] | None:
    """[s0, s1) inside one tile run: (t0, t1, global start), or None if they do not meet."""
    t0, t1 = max(s0, run[0]), min(s1, run[1])
    return (t0, t1, run[2] + t0 - run[0]) if t1 > t0 else None


def _piece(window: Window, s: Segment, q_run, k_run) -> tuple[Segment | None, bool]:
    """The piece of segment `s` in one query run x key run, under the window, and whether the
    window left its pairs as they were."""
    q, k = _cut(s.q0, s.q1, q_run), _cut(s.k0, s.k1, k_run)
    if q is None or k is None:
        return None, True
    gq, gk = (q[2], q[2] + q[1] - q[0]), (k[2], k[2] + k[1] - k[0])
    diagonal = s.causal and gq[0] < gk[1] and gk[0] < gq[1]  # (then the same tokens both sides)
    if s.causal and not diagonal and gq[0] < gk[0]:
        return None, True  # keys after the queries: the causal segment has none of these
    lo, hi = window.lo, window.hi
    if diagonal:
        # pairs kept: 0 <= d <= hi of the causal ones; the same iff hi reaches the last row
        same = hi is None or hi >= gq[1] - 1 - gk[0]
        seg = Segment(q[0], q[1], k[0], k[1], True)
    else:
        seen = relation(gq, gk, lo, hi)
        if seen == NONE:
            return None, False
        same = seen == ALL_VISIBLE
        seg = Segment(q[0], q[1], k[0], k[1], False)
    if same:
        return seg, True
    return _trim(seg._replace(causal=False, band=band_of(gq[0], gk[0], lo, hi, s.causal))), False


def _trim(s: Segment) -> Segment:
    """A banded segment cut to the rows and columns that see something (the kernel's block and
    the rows a travelling query must carry shrink with the window)."""
    lo, hi = s.band
    n_q, n_k = s.q1 - s.q0, s.k1 - s.k0
    a0 = max(0, lo) if lo is not None else 0  # row a sees b = a - lo at the latest
    a1 = min(n_q, n_k + hi) if hi is not None else n_q  # ... and b = a - hi at the earliest
    b0 = max(0, -hi) if hi is not None else 0
    b1 = min(n_k, n_q - lo) if lo is not None else n_k
    shift = a0 - b0  # a - b = (a - a0) - (b - b0) + shift
    band = (None if lo is None else lo - shift, None if hi is None else hi - shift)
    return Segment(s.q0 + a0, s.q0 + a1, s.k0 + b0, s.k0 + b1, False, band)
