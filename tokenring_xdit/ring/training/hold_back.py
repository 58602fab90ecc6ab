"""The own block of training held back in part: which heads run at step 0, which run last.

The block loop's last row (`kernel=False`) only returns the last partial home; with nothing
computed behind it, that transfer (the forward's (out, lse), the backward's dQ) is paid in the
open. With `RingConfig.train_hold_back`, part of step 0's block (our own Q against our own K/V,
which never travels) runs on that row instead, after the return is posted, so the return
travels behind it (the inference loop holds back rows of its own block the same way,
forward.py).

Note: the split is by heads, not by positions. Heads are independent, so the two pieces touch
disjoint parts of out/lse and dQ/dK/dV: no position gets a term more than without the split
(at ring 2 the input dtype's sums stay exact-equivalent to fp32 sums rounded once), and each
piece keeps the block's own mask (the causal diagonal stays one square causal call, so no
kernel's alignment of a non-square causal mask matters). Under GQA the split falls on a K/V
head boundary (query head i uses K/V head i // g):

  K/V heads | 0 .. a-1            | a .. H_kv-1           a = H_kv - H_kv // 2
  Q heads   | 0 .. a*g-1          | a*g .. H_q-1
  runs      | step 0 (the head)   | the return-only row, behind the last return (the tail)

The tail's parts of the sums start empty (out 0 / lse -inf, gradients 0) and take the returns
that arrive before it; adding to an empty start is exact, so each position's terms are the same.
A single K/V head (MQA) cannot be split: the own block then runs whole at step 0.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Piece", "Pieces", "pieces"]


@dataclass(frozen=True)
class Piece:
    """The own block on query heads `q` and K/V heads `kv` (slices of the head dimension)."""

    q: slice
    kv: slice


@dataclass(frozen=True)
class Pieces:
    head: Piece  # runs at step 0
    tail: Piece  # runs on the return-only row, behind the last return


def pieces(q_heads: int, kv_heads: int) -> Pieces | None:
    """The split of the own block by heads, or None where it cannot be split (one K/V head)."""
    if kv_heads < 2 or q_heads % kv_heads:
        return None
    g, a = q_heads // kv_heads, kv_heads - kv_heads // 2
    head = Piece(slice(0, a * g), slice(0, a))
    tail = Piece(slice(a * g, q_heads), slice(a, kv_heads))
    return Pieces(head, tail)
