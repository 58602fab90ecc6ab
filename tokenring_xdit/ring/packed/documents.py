"""Packed documents over the ring: which query/key pairs of a block share a document.

A packed sequence is several documents laid end to end; attention stays inside each document
(causal inside it for a decoder). The documents are given for the WHOLE sequence as `cu_seqlens`
(0 = b_0 < ... < b_D = total, flash-attn's convention), agreed on every rank before any transfer.

Inside a tile (a part of some rank's shard) the tokens of one document are one run, so a block is
a short list of `Segment`s (query run x key run of one document), causal on the diagonal block
and full elsewhere. A block with no segment is skipped: no kernel, no return of its partial, and
a query tile that no later holder needs stops travelling (`DocPlan`, computed alike on every
rank). Off the diagonal a zigzag block meets at most one document (the one reaching across the
chunks between the tiles). In the contiguous layout a block pairs a query shard with an earlier
key shard; in the documents layout (doc_split.py) a tile is a list of pieces and a block's
segments come from `block_pieces` (`call_plan`: a call's plan, in its agreed split's layout).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
from dataclasses import dataclass, field

import torch

from ..schedules import block_schedule
from ..schedules.blocks import ALL, FRONT, BlockStep, Rows
from ..segments import Segment
from .doc_split import CONTIGUOUS, DOCUMENTS, ROW, block_pieces, check_total, pieces_meet

__all__ = ["Documents", "DocPlan", "doc_plan", "call_plan", "block_segments"]


@dataclass(frozen=True)
class Documents:
    """The document boundaries of the global sequence (cu_seqlens as a tuple of ints)."""

    bounds: tuple[int, ...]

    @property
    def total(self) -> int:
        return self.bounds[-1]

    @property
    def count(self) -> int:
        return len(self.bounds) - 1

    @classmethod
    def of(cls, cu_seqlens, total: int | None = None) -> Documents:
        """Checked Documents from cu_seqlens (tensor or sequence of ints); ValueError says why.
        Zero-length documents are dropped (they attend nothing)."""
        if isinstance(cu_seqlens, torch.Tensor):
            if cu_seqlens.dim() != 1 or cu_seqlens.is_floating_point():
                raise ValueError("cu_seqlens must be a 1-d integer tensor")
            cu_seqlens = cu_seqlens.tolist()  # a host read (keep it on the CPU: docs)
        if isinstance(cu_seqlens, list | tuple) and all(type(x) is int for x in cu_seqlens):
            return _checked(tuple(cu_seqlens), total)  # the same offsets every layer and call
        return _check([int(x) for x in cu_seqlens], total)

    def doc_at(self, index: int) -> int:
        """Document number of global token `index`."""
        return bisect.bisect_right(self.bounds, index) - 1


def _check(bounds: list[int] | tuple[int, ...], total: int | None) -> Documents:
    """Documents.of's checks of plain ints (ValueError says why)."""
    if len(bounds) < 2 or bounds[0] != 0:
        raise ValueError(
            f"cu_seqlens must start at 0 and have >= 2 entries, got {list(bounds[:8])}"
        )
    if any(b > a for a, b in zip(bounds[1:], bounds, strict=False)):
        raise ValueError("cu_seqlens must be non-decreasing (document offsets)")
    if total is not None and bounds[-1] != total:
        raise ValueError(
            f"cu_seqlens ends at {bounds[-1]} but the global sequence has {total} tokens "
            "(cu_seqlens describe the WHOLE packed sequence, not this rank's shard; pad with "
            "a last document to reach the padded length)"
        )
    return Documents(tuple(dict.fromkeys(bounds)))  # drops repeats, keeps order


@functools.lru_cache(maxsize=64)  # bounded; an error is raised again (never cached)
def _checked(bounds: tuple[int, ...], total: int | None) -> Documents:
    return _check(bounds, total)


# --- where a rank's tokens are --------------------------------------------------------------


def _local_ranges(rank: int, q_lens: tuple[int, ...], zigzag: bool) -> list[tuple[int, int]]:
    """Global token ranges of `rank`'s shard in the row's split, in its local order."""
    if zigzag:
        n, c = len(q_lens), q_lens[rank] // 2
        back = 2 * n - 1 - rank
        return [(rank * c, (rank + 1) * c), (back * c, (back + 1) * c)]
    start = sum(q_lens[:rank])
    return [(start, start + q_lens[rank])]


def _part_ranges(ranges: list[tuple[int, int]], part: str) -> list[tuple[int, int]]:
    if part == ALL:
        return ranges
    if len(ranges) != 2:
        raise ValueError(f"a {part!r} part needs a zigzag shard")
    return [ranges[0] if part == FRONT else ranges[1]]


def _runs(docs: Documents, ranges: list[tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """doc -> (start, end) of its tokens in a tile made of `ranges` (tile coordinates)."""
    runs: dict[int, tuple[int, int]] = {}
    offset = 0
    for g0, g1 in ranges:
        i = docs.doc_at(g0) if g1 > g0 else 0
        while g0 < g1:
            end = min(g1, docs.bounds[i + 1])
            t0, t1 = offset, offset + end - g0
            if i in runs:
                if runs[i][1] != t0:  # impossible for zigzag / contiguous tiles (docstring)
                    raise AssertionError(f"document {i} is split inside a tile")
                t0 = runs[i][0]
            runs[i] = (t0, t1)
            offset, g0, i = t1, end, i + 1
    return runs


def block_segments(docs: Documents, q_ranges, k_ranges, causal: bool) -> tuple[Segment, ...]:
    """The segments of one block of the row's split (empty: no pair to attend)."""
    q_runs, k_runs = _runs(docs, q_ranges), _runs(docs, k_ranges)
    segs = []
    for doc, (q0, q1) in q_runs.items():
        if doc in k_runs:
            k0, k1 = k_runs[doc]
            if causal and (q0, q1) != (k0, k1):
                raise AssertionError("a causal block must hold the same tokens on both sides")
            segs.append(Segment(q0, q1, k0, k1, causal))
    return tuple(segs)


# --- the plan of one call -----------------------------------------------------------------


@dataclass(frozen=True)
class DocPlan:
    """Per (rank, step) of a block schedule: the kernel's segments and which transfers run.

    Pure and equal on every rank (built from the agreed documents, lengths, schedule and
    layout: the row's split or `doc_split.DOCUMENTS`). In the documents layout a block's
    segments are made when first asked for (a block holds ~2 per document; a rank runs only
    its own blocks and asks of the others only whether they attend, which the documents of
    their pieces answer: `doc_split.pieces_meet`)."""

    docs: Documents
    size: int
    segments: tuple[tuple[tuple[Segment, ...], ...], ...] | None  # [rank][step]; () = skipped
    steps: tuple[tuple[BlockStep, ...], ...]  # [rank] the schedule's rows
    split: str = ROW
    causal: bool = False  # the schedule's (the documents layout's rule needs it)
    schedule: object = field(default=None, compare=False, repr=False)  # the rows' schedule
    _made: dict = field(default_factory=dict, compare=False, repr=False)  # lazy blocks

    @property
    def packing(self) -> tuple[str, Documents]:
        """What a graph of a call with this plan bakes in: the layout and the documents (with
        the schedule and the ring's lengths, held by the graph's key too)."""
        return (self.split, self.docs)

    def block(self, rank: int, step: int) -> tuple[Segment, ...]:
        if step >= self.size:
            return ()
        if self.segments is not None:
            return self.segments[rank][step]
        found = self._made.get((rank, step))
        if found is None:
            st = self.steps[rank][step]
            q, kv = (st.q_owner, st.q_part), (rank, st.kv_part)
            found = block_pieces(self.docs.bounds, self.size, q, kv, self.causal)
            self._made[(rank, step)] = found
        return found

    def attends(self, rank: int, step: int) -> bool:
        """Whether the block of `rank` at `step` has a segment (without making it off the
        diagonal in the documents layout, where every pair of pieces that meet attends)."""
        if self.segments is not None or step >= self.size or self.steps[rank][step].causal:
            return self.block(rank, step) != ()  # (a window's plan may hold a causal flag)
        st = self.steps[rank][step]
        q, kv = (st.q_owner, st.q_part), (rank, st.kv_part)
        return pieces_meet(self.docs.bounds, self.size, q, kv)

    def q_needed(self, owner: int, after: int) -> bool:
        """Does any holder of `owner`'s query run a kernel on it after step `after`? (At step t
        rank r holds the query of r + t: the zigzag moves Q to r-1; the non-causal table to
        r+1, so its holder is owner + t.)"""
        return any(self.attends(self._holder(owner, t), t) for t in range(after + 1, self.size))

    def _holder(self, owner: int, t: int) -> int:
        for r in range(self.size):  # tiny loops: N <= a few dozen
            if self.steps[r][t].q_owner == owner:
                return r
        raise AssertionError("no holder")

    def q_send(self, rank: int, st: BlockStep) -> bool:
        return st.q_send_to is not None and self.q_needed(st.q_owner, st.step)

    def q_recv(self, rank: int, st: BlockStep) -> bool:
        return st.q_recv_from is not None and self.q_needed(st.q_recv_owner, st.step)

    def ret_send(self, rank: int, st: BlockStep) -> bool:
        return st.ret_send_to is not None and self.attends(rank, st.step - 1)

    def ret_recv(self, rank: int, st: BlockStep) -> bool:
        return st.ret_recv_from is not None and self.attends(st.ret_recv_from, st.step - 1)

    def transfers(self, rank: int) -> tuple[tuple[bool, bool, bool], ...]:
        """Per step of `rank`'s row: (q_send, q_recv, ret_recv), made once per plan and rank
        (the loops ask at every step of every call; the plan is cached by the agreed layout,
        so this table is too)."""
        found = self._made.get(("transfers", rank))
        if found is None:
            found = tuple(
                (self.q_send(rank, st), self.q_recv(rank, st), self.ret_recv(rank, st))
                for st in self.steps[rank]
            )
            self._made[("transfers", rank)] = found
        return found


@functools.lru_cache(maxsize=64)
def doc_plan(docs: Documents, schedule, q_lens: tuple[int, ...], split: str = ROW) -> DocPlan:
    """The DocPlan of `schedule` (a block schedule) over shards of `q_lens` tokens cut in
    layout `split` (the row's split, DOCUMENTS: every document cut in 2N pieces, or
    CONTIGUOUS: N contiguous shards under `schedules.CAUSAL_CONTIGUOUS`)."""
    n = len(q_lens)
    steps = tuple(schedule.block_steps(r, n) for r in range(n))
    if split == DOCUMENTS:
        check_total(docs.total, n)
        return DocPlan(docs, n, None, steps, split, bool(schedule.causal), schedule)
    zigzag = bool(schedule.causal) and n > 1 and split == ROW
    ranges = [_local_ranges(r, q_lens, zigzag) for r in range(n)]
    segments = []
    for r in range(n):
        row = []
        for st in steps[r]:
            # contiguous shards: a query shard before ours sees none of our keys
            if not st.kernel or (split == CONTIGUOUS and schedule.causal and st.q_owner < r):
                row.append(())
                continue
            q_ranges = _part_ranges(ranges[st.q_owner], st.q_part)
            k_ranges = _part_ranges(ranges[r], st.kv_part)
            row.append(block_segments(docs, q_ranges, k_ranges, st.causal))
        segments.append(tuple(row))
    if split == CONTIGUOUS and schedule.causal:
        steps = _trimmed(steps, segments, n)
    return DocPlan(docs, n, tuple(segments), steps, split, schedule=schedule)


def call_plan(docs: Documents, split: str, causal: bool, q_lens: tuple[int, ...]) -> DocPlan:
    """The plan of a call over shards of `q_lens` tokens in layout `split` (its schedule:
    `DocPlan.schedule`)."""
    return doc_plan(docs, block_schedule(causal, split), q_lens, split)


def _trimmed(steps, segments, n: int) -> tuple[tuple[BlockStep, ...], ...]:
    """The contiguous layout's rows with every travelling query cut to the prefix its later
    holders attend with (`Rows`): an earlier shard meets only the documents that reach back
    into it, the first ones of the query's shard. The step-0 owner holds all of its query; a
    partial covers the rows its holder held."""
    used = [[0] * n for _ in range(n)]  # [owner][step]: rows the holder's kernel reads
    for r in range(n):
        for t, st in enumerate(steps[r][:n]):
            if segments[r][t]:
                used[st.q_owner][t] = max(sg.q1 for sg in segments[r][t])
    held = [[max(u[t:]) for t in range(n)] for u in used]  # rows needed from step t on

    def rows(owner: int, t: int):
        return ALL if t == 0 else Rows(held[owner][t])

    out = []
    for r in range(n):
        row = []
        for st in steps[r]:
            t, change = st.step, {}
            if st.kernel:
                change["q_part"] = rows(st.q_owner, t)
            if st.q_send_to is not None:
                change["q_send_part"] = rows(st.q_owner, t + 1)
                change["q_recv_part"] = rows(st.q_recv_owner, t + 1)
            if st.ret_send_to is not None:
                change["ret_send_part"] = rows((r + t - 1) % n, t - 1)
                change["ret_recv_part"] = rows(r, t - 1)
            row.append(dataclasses.replace(st, **change))
        out.append(tuple(row))
    return tuple(out)
