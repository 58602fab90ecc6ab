"""What a packed block hands its kernel: segments, and the runs of them one varlen call covers.
Kernels see these only, never documents or cuts; ring/packed/ makes them and imports this
without the kernels package (which imports the input check)."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Segment", "segment_runs"]


class Segment(NamedTuple):
    """Queries [q0, q1) of a tile against keys [k0, k1) of a tile, one document; `causal`:
    the same tokens on both sides, masked causally (else every key is visible). `band`: a
    sliding window's (lo, hi) in the segment's own rows a and columns b: only pairs with
    lo <= a - b <= hi are visible (None: unbounded; a banded segment is never `causal`, its
    band says it). (A named tuple: a packed row of many documents has ~10^5 of them per plan;
    this is the cheap record.)"""

    q0: int
    q1: int
    k0: int
    k1: int
    causal: bool
    band: tuple[int | None, int | None] | None = None

    @property
    def pairs(self) -> int:
        n_q, n_k = self.q1 - self.q0, self.k1 - self.k0
        if self.band is not None:
            lo, hi = self.band
            below = 0 if lo is None else _below(n_q, n_k, lo - 1)
            return max(_below(n_q, n_k, hi) - below, 0)
        return n_q * (n_q + 1) // 2 if self.causal else n_q * n_k


def _below(n_q: int, n_k: int, x: int | None) -> int:
    """Pairs (a, b) of [0, n_q) x [0, n_k) with a - b <= x (None: all of them): row a has the
    columns b >= a - x, n_k - clamp(a - x, 0, n_k) of them."""
    if x is None:
        return n_q * n_k
    total = n_q * n_k
    t0, t1 = -x, n_q - 1 - x  # t = a - x over the rows
    lin0, lin1 = max(t0, 1), min(t1, n_k)  # rows where 0 < t <= n_k lose t columns
    if lin1 >= lin0:
        total -= (lin0 + lin1) * (lin1 - lin0 + 1) // 2
    capped = t1 - max(t0, n_k + 1) + 1  # rows with t > n_k lose all n_k
    return total - max(capped, 0) * n_k


def segment_runs(segs: tuple[Segment, ...]) -> list[list[Segment]]:
    """Runs of segments that abut on both sides with one causal flag: one varlen call each
    (a banded segment alone).
    A segment joins the run that ends where it starts (in the documents layout the runs of a
    block interleave: a query piece meets its document's front and back key pieces)."""
    groups: list[list[Segment]] = []
    ends: dict[tuple[int, int, bool], list[Segment]] = {}
    for s in sorted(segs, key=lambda s: (s.q0, s.k0)):
        if s.band is not None:  # its own call: a window is one per call
            groups.append([s])
            continue
        group = ends.pop((s.q0, s.k0, s.causal), None)
        if group is None:
            group = []
            groups.append(group)
        group.append(s)
        ends[(s.q1, s.k1, s.causal)] = group
    return groups
