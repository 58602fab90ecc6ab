"""The "documents" layout of a packed row: every document cut into 2N pieces, zigzag per document.

The row's own zigzag (chunks r and 2N-1-r of the row) balances the ranks only when documents
are short against a chunk: a long document puts its big rectangles on the ranks that hold its
chunks. The documents layout cuts EACH document d into 2N contiguous pieces p_0 .. p_{2N-1}
(in order) and gives rank r, in this local order,

    [p_r of doc 0, ..., p_r of doc D-1,  p_{2N-1-r} of doc 0, ..., p_{2N-1-r} of doc D-1]

so its FRONT half is every document's piece r and its BACK half every document's piece 2N-1-r.
Per document, query piece a against key piece b is full if a > b, causal if a == b and nothing
if a < b: the dense zigzag's structure, so the causal zigzag block schedule runs unchanged
(schedules/zigzag.py); only a block's segments differ (several documents per block, each a full
rectangle or a causal diagonal). Non-causal calls use the same placement (every block of a
document is full).

Lengths not divisible by 2N, losing no token: the row's total T must divide by 2N (as for the
row's zigzag; pad with one more document). Piece lengths of document d are floor(L_d / 2N) or
one more: the L_d mod 2N remainder tokens of every document are dealt round-robin over the 2N
piece slots with ONE counter running across documents (document d's extra tokens go to slots
c, c+1, ..., c+rem_d-1 mod 2N, then c advances by rem_d). The remainders add up to a multiple
of 2N, so every slot holds exactly T/2N tokens: every rank's halves are T/2N each. Pieces may be
empty (documents shorter than 2N). Example, T = 16, N = 2 (4 slots), documents of 7, 2, 7:

    doc 0 (7 = 4 x 1 + 3): extras to slots 0, 1, 2   -> pieces 2 2 2 1   (c = 3)
    doc 1 (2 = 4 x 0 + 2): extras to slots 3, 0      -> pieces 1 0 0 1   (c = 1)
    doc 2 (7 = 4 x 1 + 3): extras to slots 1, 2, 3   -> pieces 1 2 2 2   (c = 0)
    slot sums: 4 4 4 4; rank 0 holds slots 0 and 3 (8 tokens), rank 1 slots 1 and 2 (8 tokens)

Everything here is pure (no torch), equal on every rank for equal documents.
"""

from __future__ import annotations

import functools
from itertools import accumulate

from ..schedules.blocks import ALL, FRONT
from ..segments import Segment

__all__ = [
    "ROW", "DOCUMENTS", "CONTIGUOUS", "LAYOUTS", "normal_split", "check_total",
    "piece_lengths", "local_pieces", "local_positions", "block_pieces", "pieces_meet",
    "piece_pairs",
]  # fmt: skip

# ROW: the row's own split (the zigzag; contiguous shards when not causal). CONTIGUOUS: a
# causal row cut in N contiguous shards, documents whole where a shard holds them
# (schedules/contiguous.py; the same cut as ROW when not causal, which it then becomes). The
# names are also the split kinds (ring/split/value.py).
ROW, DOCUMENTS, CONTIGUOUS = "zigzag", "documents", "contiguous"
LAYOUTS = (ROW, DOCUMENTS, CONTIGUOUS)


def normal_split(split: str, causal: bool, world_size: int) -> str:
    """The layout a row cut in `split` runs as: contiguous shards of a row that is not causal,
    or over one rank, are the row's own split."""
    return ROW if split == CONTIGUOUS and not (causal and world_size > 1) else split


def check_total(total: int, world_size: int) -> None:
    """ValueError unless `total` tokens split into 2N equal slots."""
    if total % (2 * world_size):
        raise ValueError(
            f"the documents layout of {total} tokens over {world_size} ranks needs a multiple "
            f"of 2 x {world_size} = {2 * world_size} tokens; pad the row with one more document "
            f"to {-(-total // (2 * world_size)) * 2 * world_size} tokens (labels = -100)"
        )


@functools.lru_cache(maxsize=64)
def piece_lengths(bounds: tuple[int, ...], world_size: int) -> tuple[tuple[int, ...], ...]:
    """[document][slot] piece lengths (2N slots) by the round-robin remainder rule."""
    slots, c, out = 2 * world_size, 0, []
    for a, b in zip(bounds, bounds[1:], strict=False):
        base, rem = divmod(b - a, slots)
        lens = [base] * slots
        for i in range(rem):
            lens[(c + i) % slots] += 1
        c = (c + rem) % slots
        out.append(tuple(lens))
    return tuple(out)


@functools.lru_cache(maxsize=256)
def local_pieces(
    bounds: tuple[int, ...], rank: int, world_size: int
) -> tuple[tuple[int, int, int, int], ...]:
    """Rank `rank`'s pieces in its local order: (document, slot, global start, global end),
    the front half (slot r of every document) then the back half (slot 2N-1-r)."""
    check_total(bounds[-1], world_size)
    lens = piece_lengths(bounds, world_size)
    starts = [tuple(accumulate(x, initial=a)) for x, a in zip(lens, bounds[:-1], strict=True)]
    out = []
    for slot in (rank, 2 * world_size - 1 - rank):
        out += [(d, slot, at[slot], at[slot + 1]) for d, at in enumerate(starts)]
    return tuple(out)


def piece_pairs(bounds: tuple[int, ...], world_size: int, causal: bool) -> list[int]:
    """The (query, key) pairs each rank attends in the documents layout (its keys against every
    query that comes by), from the piece lengths alone: O(documents x N), no plan."""
    slots, work = 2 * world_size, [0] * world_size
    for lens in piece_lengths(bounds, world_size):
        later = list(accumulate(reversed(lens)))[::-1] + [0]  # later[a]: tokens in slots >= a
        for r in range(world_size):
            for b in (r, slots - 1 - r):
                if causal:
                    work[r] += lens[b] * (lens[b] + 1) // 2 + later[b + 1] * lens[b]
                else:
                    work[r] += later[0] * lens[b]
    return work


def local_positions(bounds: tuple[int, ...], rank: int, world_size: int) -> list[int]:
    """The global index of every local token of `rank` (its shard's order)."""
    return [i for _, _, g0, g1 in local_pieces(bounds, rank, world_size) for i in range(g0, g1)]


@functools.lru_cache(maxsize=256)
def _tile(bounds: tuple[int, ...], rank: int, world_size: int, part: str):
    """The non-empty pieces of `part` of a rank's shard in tile coordinates: in tile order as
    (document, slot, start, end), and per document as (slot, start, end)."""
    pieces = local_pieces(bounds, rank, world_size)
    half = len(pieces) // 2
    if part != ALL:
        pieces = pieces[:half] if part == FRONT else pieces[half:]
    ordered, by_doc, offset = [], [[] for _ in range(half)], 0
    for d, slot, g0, g1 in pieces:
        if g1 > g0:
            ordered.append((d, slot, offset, offset + g1 - g0))
            by_doc[d].append((slot, offset, offset + g1 - g0))
        offset += g1 - g0
    return ordered, by_doc, frozenset(d for d, _, _, _ in ordered)


def pieces_meet(bounds, world_size: int, q: tuple[int, str], kv: tuple[int, str]) -> bool:
    """Whether the `q` and `kv` tiles (as in `block_pieces`) share a document. Off the
    diagonal every pair of pieces that meet attends (the zigzag schedule pairs query slots
    after key slots, or the call is not causal), so this is whether the block attends."""
    return not _tile(bounds, q[0], world_size, q[1])[2].isdisjoint(
        _tile(bounds, kv[0], world_size, kv[1])[2]
    )


def block_pieces(bounds, world_size: int, q: tuple[int, str], kv: tuple[int, str], causal: bool):
    """The segments of one block in the documents layout: the `q` = (owner, part) tile against
    the `kv` = (rank, part) tile. Per document, query slot a against key slot b is full if
    a > b (or the call is not causal), causal if a == b (the same tokens on both sides: the
    diagonal block), nothing if a < b. In query-tile order."""
    ordered = _tile(bounds, q[0], world_size, q[1])[0]
    keys = _tile(bounds, kv[0], world_size, kv[1])[1]
    segs = []
    for d, a, q0, q1 in ordered:
        for b, k0, k1 in keys[d]:
            if not causal or a > b:
                segs.append(Segment(q0, q1, k0, k1, False))
            elif a == b:
                if (q0, q1) != (k0, k1):
                    raise AssertionError("a causal piece must hold the same tokens on both sides")
                segs.append(Segment(q0, q1, k0, k1, True))
    return tuple(segs)
