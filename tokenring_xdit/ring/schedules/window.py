"""Sliding-window attention over the ring: the window value and its predicates on position ranges.

A window is flash-attn's `window_size=(left, right)`: the key at global position kp is visible
to the query at qp iff qp - left <= kp <= qp + right (-1: unbounded on that side), and, in a
causal call, kp <= qp (so a causal call's `right` is 0; a causal window of W tokens is
(W - 1, 0)). Everything is said through d = qp - kp: visible iff `lo <= d <= hi`.

Who does what (everything below the call's seam; pure here, no torch):
  - this module: the value (`Window.of` checks and normalises `window_size`) and, for a block
    of a query range against a key range, whether none / some / all of its pairs are visible
    (`relation`), and the band a kernel gets for a partly visible rectangle (`band_of`);
  - ring/packed/window_plan.py: the call's plan (an `agreed_ring.BlockPlan`, like packed
    documents'): per rank and step the block's segments (ring/segments.py, a partly visible
    rectangle with its band, segment-local), the blocks skipped (no kernel, no return) and the
    transfers no later holder needs (Q stops travelling); ring/packed/window_traffic.py: the
    steps run and bytes per step it predicts;
  - kernels: the exact/masked kernel (any device) and torch's flash op with its window
    arguments (CUDA, kernels/varlen.py) read the band; `registry.window_pair` routes a block's
    causal flag to the call's dense kernel and its segments to one of those.

Note (causal zigzag, N = 4, W a causal window shorter than a chunk; "." skipped, "b" back half):

  step | rank 0     | rank 1     | rank 2     | rank 3       chunk distance of the pairs met
  -----+------------+------------+------------+-----------
   0   | Q0 x KV0   | Q1 x KV1   | Q2 x KV2   | Q3 x KV3     0 (diagonals, banded)
   1   | Q1 x F0    | Q2 x F1    | Q3 x F2    | .            1 (adjacent chunks: a corner)
   2   | .          | .          | .          | .            2: nothing, no kernel, no return
   3   | .          | Q0b x KV1  | Q1b x KV2  | Q2b x KV3    1 (back halves, after the wrap)

  (rank 3 at step 1 holds Q0's back half, chunk 7, three chunks after its own 3 and 4.)
  The zigzag's back halves meet their neighbours only after the wrap, so Q still travels the
  whole ring there (only kernels and returns are skipped); on contiguous shards (the causal
  contiguous table) a query needs the ceil(W / L) shards before it only and stops travelling
  after them, trimmed to the rows the window reaches (`blocks.Rows`).
"""

from __future__ import annotations

import operator
from typing import NamedTuple

__all__ = ["Window", "NONE", "SOME", "ALL_VISIBLE", "relation", "band_of"]

NONE, SOME, ALL_VISIBLE = "none", "some", "all"


class Window(NamedTuple):
    """A checked window: visible iff `lo <= qp - kp <= hi` (None: unbounded)."""

    left: int  # -1: unbounded
    right: int  # -1: unbounded; 0 in a causal call

    @classmethod
    def of(cls, window_size, causal: bool) -> Window | None:
        """The window of `window_size` = (left, right) (flash-attn's convention), None when it
        hides nothing the call's causality does not (ValueError says what is wrong)."""
        if window_size is None:
            return None
        try:
            left, right = (operator.index(x) for x in window_size)  # ints, not floats
            bad = any(isinstance(x, bool) for x in window_size)
        except (TypeError, ValueError):
            bad = True
        if bad:
            raise ValueError(
                f"window_size must be a pair of ints (left, right), got {window_size!r}"
            )
        if left < -1 or right < -1:
            raise ValueError(
                f"window_size must be (left, right) with each >= 0 or -1 (unbounded), got "
                f"{tuple(window_size)!r}; a causal window of W tokens is (W - 1, 0)"
            )
        if causal:
            right = 0  # flash-attn: causal forces the right side
        window = cls(left, right)
        return None if left == -1 and (right == -1 or causal) else window

    @property
    def lo(self) -> int | None:
        return None if self.right == -1 else -self.right

    @property
    def hi(self) -> int | None:
        return None if self.left == -1 else self.left

    def visible(self, qp: int, kp: int) -> bool:
        return _inside(qp - kp, self.lo, self.hi)


def _inside(d: int, lo: int | None, hi: int | None) -> bool:
    return (lo is None or d >= lo) and (hi is None or d <= hi)


def _bound(a: int | None, b: int | None, pick) -> int | None:
    """pick(a, b) of two bounds where None is unbounded."""
    return b if a is None else a if b is None else pick(a, b)


def relation(q: tuple[int, int], k: tuple[int, int], lo: int | None, hi: int | None) -> str:
    """Of the pairs of queries [q0, q1) x keys [k0, k1) (global positions): NONE, SOME or
    ALL_VISIBLE under `lo <= qp - kp <= hi`. The differences of two integer ranges are one
    integer range [q0 - k1 + 1, q1 - 1 - k0], so comparing its ends decides it."""
    if q[1] <= q[0] or k[1] <= k[0]:
        return NONE
    d_min, d_max = q[0] - k[1] + 1, q[1] - 1 - k[0]
    if (hi is not None and d_min > hi) or (lo is not None and d_max < lo):
        return NONE
    if _inside(d_min, lo, hi) and _inside(d_max, lo, hi):
        return ALL_VISIBLE
    return SOME


def band_of(
    q0: int, k0: int, lo: int | None, hi: int | None, causal: bool = False
) -> tuple[int | None, int | None]:
    """The band of a rectangle whose first query is at global q0 and first key at k0, in the
    rectangle's own coordinates (row a, column b): visible iff lo' <= a - b <= hi'. `causal`:
    the pairs are also limited to kp <= qp (a causal segment's)."""
    if causal:
        lo = _bound(lo, 0, max)
    off = q0 - k0  # qp - kp = (a - b) + off
    return (None if lo is None else lo - off, None if hi is None else hi - off)
