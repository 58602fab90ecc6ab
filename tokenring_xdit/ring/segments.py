"""What a packed block hands its kernel: segments, and the runs of them one varlen call covers.
Kernels see these only, never documents or cuts; ring/packed/ makes them and imports this
without the kernels package (which imports the input check)."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Segment", "segment_runs"]


class Segment(NamedTuple):
    """Queries [q0, q1) of a tile against keys [k0, k1) of a tile, one document; `causal`:
    the same tokens on both sides, masked causally (else every key is visible). (A named tuple:
    a packed row of many documents has ~10^5 of them per plan; this is the cheap record.)"""

    q0: int
    q1: int
    k0: int
    k1: int
    causal: bool

    @property
    def pairs(self) -> int:
        n_q, n_k = self.q1 - self.q0, self.k1 - self.k0
        return n_q * (n_q + 1) // 2 if self.causal else n_q * n_k


def segment_runs(segs: tuple[Segment, ...]) -> list[list[Segment]]:
    """Runs of segments that abut on both sides with one causal flag: one varlen call each.
    A segment joins the run that ends where it starts (in the documents layout the runs of a
    block interleave: a query piece meets its document's front and back key pieces)."""
    groups: list[list[Segment]] = []
    ends: dict[tuple[int, int, bool], list[Segment]] = {}
    for s in sorted(segs, key=lambda s: (s.q0, s.k0)):
        group = ends.pop((s.q0, s.k0, s.causal), None)
        if group is None:
            group = []
            groups.append(group)
        group.append(s)
        ends[(s.q1, s.k1, s.causal)] = group
    return groups
