"""The K/V family's plan: the mask of every block its table runs, with packed documents and / or
a sliding window, and the transfers those blocks need.

The K/V family (schedules/kv_both_ways.py) runs, on rank r, its queries (or their BACK part)
against a half of owner j's K/V (or the half's FRONT part), and the diagonal Q_r x KV_r at step
0. Every block is placed by GLOBAL positions: the row's split (zigzag chunks r and 2N-1-r when
causal, contiguous shards in rank order when not) places the query rows, the half's local token
ranges (`half_ranges`: every token for a head half) the keys. With packed documents a block
becomes the segments (ring/segments.py) of the tokens that share a document; off the diagonal a
causal block lies wholly in its queries' past (the Note of the schedule), so its segments are
never masked. A window then narrows the block as it does TokenRing's (`window_plan.narrowed`:
pieces cut where a tile jumps in position, dropped, kept, or kept with their band). A block with
nothing visible is not run, and the rows keep only the transfers a later block needs
(`kv_both_ways.kept_steps`: who sends what, in its windows' Note). Pure and equal on every rank;
made once per (documents, lengths, causal, halves, window).
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from dataclasses import dataclass, field

from ..schedules.blocks import FRONT
from ..schedules.kv_both_ways import A, B, KvStep, front_len, half_ranges, kept_steps, kv_steps
from ..schedules.window import Window
from ..segments import Segment
from .doc_split import ROW
from .documents import Documents, _local_ranges, _part_ranges, block_segments
from .window_plan import narrowed

__all__ = ["KvPlan", "kv_plan"]

Mask = bool | tuple[Segment, ...]  # the causal flag (a dense block), or segments (() : not run)


@dataclass(frozen=True)
class KvPlan:
    """Per rank: the diagonal's mask and, per step 1..N-1 and half (A, B), the block's: the
    causal flag (the window left the block whole: the call's dense kernel runs it), segments,
    or () (not run); and the rows of the table with the transfers those blocks need
    (`kept_steps`). Compared and hashed by what makes it (the rest follows from those)."""

    docs: Documents | None  # None: dense (a window's plan)
    q_lens: tuple[int, ...]
    causal: bool
    by_heads: bool
    window: Window | None
    diagonals: tuple[Mask, ...] = field(compare=False, repr=False)  # [rank]
    blocks: tuple[tuple[tuple[Mask, ...], ...], ...] = field(
        compare=False, repr=False
    )  # [rank][step - 1][half]
    tables: tuple[tuple[KvStep, ...], ...] = field(compare=False, repr=False)  # [rank]

    @property
    def packing(self) -> Hashable:
        """What a graph of a call with this plan bakes in (as `DocPlan.packing` and
        `WindowPlan.packing`)."""
        if self.window is None:
            return (ROW, self.docs)
        return ("window", tuple(self.window), ROW, self.docs)

    def diagonal(self, rank: int) -> Mask:
        return self.diagonals[rank]

    def block(self, rank: int, step: int, half: int) -> Mask:
        """The mask of `rank`'s block of `half` at `step` (0: the diagonal)."""
        return self.diagonals[rank] if step == 0 else self.blocks[rank][step - 1][half]

    def steps(self, rank: int) -> tuple[KvStep, ...]:
        """`rank`'s rows, with only the transfers its blocks and its peers' need."""
        return self.tables[rank]

    def kernel_calls(self, rank: int) -> int:
        """Kernels one pass runs on `rank`: the diagonal and every block not skipped."""
        return 1 + sum(m != () for row in self.blocks[rank] for m in row)


def _to_global(local, owner_ranges) -> list[tuple[int, int]]:
    """Local token ranges of a shard, in tile order, as global ranges (`owner_ranges`: the
    shard's global ranges in its local order)."""
    out = []
    for a, b in local:
        at = 0
        for g0, g1 in owner_ranges:
            lo, hi = max(a, at), min(b, at + g1 - g0)
            if lo < hi:
                out.append((g0 + lo - at, g0 + hi - at))
            at += g1 - g0
    return out


def _kv_local(length: int, half: int, part: str, causal: bool, by_heads: bool):
    """A held half's `part` (ALL / FRONT) as local token ranges of its owner, in tile order."""
    ranges = half_ranges(length, causal, by_heads)[half]
    if part != FRONT:
        return list(ranges)
    left, out = front_len(length, half, causal, by_heads), []
    for a, b in ranges:
        take = min(b - a, left)
        if take > 0:
            out.append((a, a + take))
        left -= take
    return out


@functools.lru_cache(maxsize=64)
def kv_plan(
    docs: Documents | None, q_lens: tuple[int, ...], causal: bool, by_heads: bool,
    window: Window | None = None,
) -> KvPlan:  # fmt: skip
    """The plan of a K/V family call over shards of `q_lens` tokens (K/V: the same tokens) in
    the row's split, with packed `docs` (None: dense) and / or a sliding `window`."""
    n = len(q_lens)
    shards = [_local_ranges(r, q_lens, causal and n > 1) for r in range(n)]

    def mask(q_ranges, k_ranges, masked: bool) -> Mask:
        base = masked if docs is None else block_segments(docs, q_ranges, k_ranges, masked)
        return base if window is None else narrowed(window, base, q_ranges, k_ranges)

    diagonals = tuple(mask(shards[r], shards[r], causal) for r in range(n))
    blocks = []
    for r in range(n):
        rows = []
        for st in kv_steps(r, n, causal)[1:n]:
            pair = []
            for half in (A, B):
                row = st.halves[half]
                keys = _kv_local(q_lens[row.owner], half, row.kv_part, causal, by_heads)
                k_ranges = _to_global(keys, shards[row.owner])
                pair.append(mask(_part_ranges(shards[r], row.q_part), k_ranges, False))
            rows.append(tuple(pair))
        blocks.append(tuple(rows))
    tables = _tables(tuple(blocks), n, causal)
    return KvPlan(docs, q_lens, causal, by_heads, window, diagonals, tuple(blocks), tables)


def _tables(blocks, n: int, causal: bool) -> tuple[tuple[KvStep, ...], ...]:
    """Every rank's rows with the transfers its blocks need (`kept_steps`)."""
    used = tuple(
        tuple(tuple(blocks[(owner + ahead * s) % n][s - 1][half] != () for s in range(1, n))
              for half, ahead in ((A, 1), (B, -1)))
        for owner in range(n)
    )  # fmt: skip
    return tuple(kept_steps(r, n, causal, used) for r in range(n))
