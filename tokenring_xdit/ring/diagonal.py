"""The own block of training held back in part: which pieces run at step 0, which run last.

The block loop's last row (`kernel=False`) only returns the last partial home; with nothing
computed behind it, that transfer (the forward's (out, lse), the backward's dQ) is paid in the
open. With `RingConfig.train_hold_back`, part of step 0's block (our own Q against our own K/V,
which never travels) runs on that row instead, after the return is posted, so the return
travels behind it (the inference loop does the same with its held-back rows, forward.py).

Note: the pieces of the own block (L local queries and keys; F/B = front/back half, a = L_k -
L_k // 4). Every causal piece is square (the same tokens on both sides), so no kernel's
alignment of a non-square causal mask matters; the head covers every query row and, causally,
every key row, so the sums start from copies and only the tail adds.

  causal (zigzag shard: F = chunk r, B = chunk 2N-1-r)   non-causal
              K_F      K_B                                           K[:a]    K[a:]
    Q_F   | head     |  -      |  (nothing: F precedes B)    Q_all | head   | tail |
    Q_B   | tail     | head    |
          | (full)   | (causal)|

  Sums that gain a term: causal dQ_B and dK_F/dV_F; non-causal dQ and dK/dV[a:] (zeroed
  first). Accumulators are fp32 wherever a position gets more than two terms, so the result is
  rounded once, as without the split.
"""

from __future__ import annotations

from dataclasses import dataclass

from .schedules.blocks import BACK, FRONT, part_slice

__all__ = ["Piece", "Pieces", "pieces"]

# The non-causal tail: this share of the local keys (the last ones).
NON_CAUSAL_TAIL = 0.25


@dataclass(frozen=True)
class Piece:
    """Queries `q` against keys `k` (positions in the local sequences), causal or full."""

    q: slice
    k: slice
    causal: bool


@dataclass(frozen=True)
class Pieces:
    head: tuple[Piece, ...]  # run at step 0; their query rows cover all queries, disjointly
    tail: tuple[Piece, ...]  # run on the return-only row, behind the last return
    zero_k: slice | None  # key rows no head piece covers (their sums start at zero)


def pieces(causal: bool, q_len: int, k_len: int) -> Pieces | None:
    """The split of the own block, or None where it cannot be split (too short)."""
    if causal:
        if q_len != k_len or q_len < 2:
            return None
        front, back = part_slice(FRONT, q_len), part_slice(BACK, q_len)
        head = (Piece(front, front, True), Piece(back, back, True))
        return Pieces(head, (Piece(back, front, False),), None)
    if k_len < 2 or q_len < 1:
        return None
    a = k_len - max(1, round(k_len * NON_CAUSAL_TAIL))
    rows = slice(0, q_len)
    return Pieces((Piece(rows, slice(0, a), False),), (Piece(rows, slice(a, k_len), False),),
                  slice(a, k_len))  # fmt: skip
