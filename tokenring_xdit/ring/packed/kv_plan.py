"""Packed documents in the K/V family: the segments of every block its table runs.

The K/V family (schedules/kv_both_ways.py) runs, on rank r, its queries (or their BACK part)
against a half of owner j's K/V (or the half's FRONT part), and the diagonal Q_r x KV_r at step
0. With packed documents each block becomes the segments (ring/segments.py) of the query and key
tokens that share a document, found from their GLOBAL positions: the row's split (zigzag chunks r
and 2N-1-r when causal, contiguous shards in rank order when not) places the query rows, the
half's local token ranges (`half_ranges`: every token for a head half) the keys. Off the diagonal
a causal block lies wholly in its queries' past (the Note of the schedule), so its segments are
never masked. A block with no segment is not run. Pure and equal on every rank; made once per
(documents, lengths, causal, halves).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from ..schedules.blocks import FRONT
from ..schedules.kv_both_ways import A, B, front_len, half_ranges, kv_steps
from ..segments import Segment
from .doc_split import ROW
from .documents import Documents, _local_ranges, _part_ranges, block_segments

__all__ = ["KvPlan", "kv_plan"]

Blocks = tuple[tuple[Segment, ...], ...]


@dataclass(frozen=True)
class KvPlan:
    """Per rank: the diagonal's segments and, per step 1..N-1 and half (A, B), the block's
    (() = not run). Compared and hashed by what makes it (the tables follow from those)."""

    docs: Documents
    q_lens: tuple[int, ...]
    causal: bool
    by_heads: bool
    diagonals: Blocks = field(compare=False, repr=False)  # [rank]
    blocks: tuple[tuple[tuple[tuple[Segment, ...], ...], ...], ...] = field(
        compare=False, repr=False
    )  # [rank][step - 1][half]

    @property
    def packing(self) -> tuple[str, Documents]:
        """What a graph of a call with this plan bakes in (as `DocPlan.packing`)."""
        return (ROW, self.docs)

    def diagonal(self, rank: int) -> tuple[Segment, ...]:
        return self.diagonals[rank]

    def block(self, rank: int, step: int, half: int) -> tuple[Segment, ...]:
        """The segments of `rank`'s block of `half` at `step` (0: the diagonal)."""
        return self.diagonals[rank] if step == 0 else self.blocks[rank][step - 1][half]

    def kernel_calls(self, rank: int) -> int:
        """Kernels one pass runs on `rank`: the diagonal and every block with a segment."""
        return 1 + sum(bool(segs) for row in self.blocks[rank] for segs in row)


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
def kv_plan(docs: Documents, q_lens: tuple[int, ...], causal: bool, by_heads: bool) -> KvPlan:
    """The plan of a K/V family call over shards of `q_lens` tokens (K/V: the same tokens) in
    the row's split."""
    n = len(q_lens)
    shards = [_local_ranges(r, q_lens, causal and n > 1) for r in range(n)]
    diagonals = tuple(block_segments(docs, shards[r], shards[r], causal) for r in range(n))
    blocks = []
    for r in range(n):
        rows = []
        for st in kv_steps(r, n, causal)[1:n]:
            pair = []
            for half in (A, B):
                row = st.halves[half]
                keys = _kv_local(q_lens[row.owner], half, row.kv_part, causal, by_heads)
                k_ranges = _to_global(keys, shards[row.owner])
                pair.append(block_segments(docs, _part_ranges(shards[r], row.q_part),
                                           k_ranges, False))  # fmt: skip
            rows.append(tuple(pair))
        blocks.append(tuple(rows))
    return KvPlan(docs, q_lens, causal, by_heads, diagonals, tuple(blocks))
