"""Packed documents from position ids that restart at 0 at each document, and the claims the
ring exchanges to learn them.

With position ids that restart, each rank sees only its own tokens. Every token tells where
its document starts (global index - position id), so each rank CLAIMS, per local chunk, the
start of the document its first token belongs to, plus every start inside its chunks; the
ring all-gathers the claims and every rank builds the same documents from their union and
checks them alike (same data, same verdict on every rank). Agreed in ring/agree/; the row's
split only (the documents layout needs cu_seqlens: doc_split.py).
"""

from __future__ import annotations

import bisect

import torch

from .documents import Documents

__all__ = ["documents_from_position_ids", "claim_count", "local_claims", "documents_from_claims"]


def documents_from_position_ids(position_ids: torch.Tensor) -> Documents:
    """Documents of a FULL packed sequence from its position ids, which restart at 0 at each
    document (transformers' DataCollatorWithFlattening, TRL's padding-free packing): the claims
    of one rank that holds it all. position_ids: (S,) or (b, S) with equal rows."""
    length = position_ids.shape[-1]
    if not length or claim_count(position_ids, length, 1) < 0 or _rows_of(position_ids)[0]:
        raise ValueError(
            "packed position_ids must be one row (batch size 1, or equal rows: pack every "
            "document into ONE row, as DataCollatorWithFlattening does), start at 0 and count "
            "up by one inside each document, restarting at 0 where a document starts"
        )
    return documents_from_claims([local_claims(position_ids, [0], length)], 1, length)


def _rows_of(position_ids: torch.Tensor) -> torch.Tensor | None:
    """The one position-id row of a (s,) or (b, s) tensor whose rows are equal, else None."""
    p = position_ids.reshape(-1, position_ids.shape[-1]) if position_ids.dim() > 1 else None
    if p is None:
        return position_ids.to("cpu", torch.int64)
    if p.shape[0] > 1 and not bool((p == p[:1]).all()):
        return None
    return p[0].to("cpu", torch.int64)


def _chunk_bounds(length: int, chunks: int) -> list[tuple[int, int]]:
    half = length // chunks
    return [(0, length)] if chunks == 1 else [(0, half), (half, length)]


def claim_count(position_ids: torch.Tensor, length: int, chunks: int) -> int:
    """How many claims this rank will send (-1: the position ids are not packed positions of
    `length` tokens: rows differ, a wrong length, or a step other than +1 / restart at 0)."""
    p = _rows_of(position_ids)
    if p is None or p.numel() != length or (length and int(p.min()) < 0):
        return -1
    count = 0
    for a, b in _chunk_bounds(length, chunks):
        seg = p[a:b]
        if seg.numel() > 1 and not bool(((seg[1:] == seg[:-1] + 1) | (seg[1:] == 0)).all()):
            return -1
        count += 2 + (int((seg[1:] == 0).sum()) if seg.numel() > 1 else 0)
    return count


def local_claims(position_ids: torch.Tensor, starts: list[int], length: int) -> list[int]:
    """[(global start of chunk, start of its first token's document) per chunk..., then every
    document start inside the chunks]; `starts`: the global index of each local chunk."""
    p = _rows_of(position_ids)
    heads, inner = [], []
    for (a, b), g in zip(_chunk_bounds(length, len(starts)), starts, strict=True):
        if b > a:
            heads += [g, g - int(p[a])]
            inner += [g + int(i) + 1 for i in (p[a + 1 : b] == 0).nonzero().flatten().tolist()]
        else:
            heads += [-1, -1]  # an empty chunk claims nothing
    return heads + inner


def documents_from_claims(claims: list[list[int]], chunks: int, total: int) -> Documents:
    """The documents every rank's claims describe; ValueError (naming the rank) if they do not
    fit together. Equal input on every rank gives an equal result or an equal error."""
    starts = {0}
    for c in claims:
        starts.update(
            s for g, s in zip(c[0 : 2 * chunks : 2], c[1 : 2 * chunks : 2], strict=False) if g >= 0
        )
        starts.update(c[2 * chunks :])
    ordered = sorted(starts)
    for r, c in enumerate(claims):
        for g, s in zip(c[0 : 2 * chunks : 2], c[1 : 2 * chunks : 2], strict=True):
            if g < 0:
                continue
            # the document of token g starts at s: no other document may start in (s, g]
            later = bisect.bisect_right(ordered, s)
            if s < 0 or (later < len(ordered) and ordered[later] <= g):
                raise ValueError(
                    f"TokenRing: packed position_ids do not fit together across the ring: rank "
                    f"{r}'s token {g} has position {g - s}, but a document starts at "
                    f"{ordered[later] if s >= 0 else 'a negative index'}; pass the position ids "
                    "of ONE packed sequence cut by shard_batch / shard (or pass cu_seqlens)"
                )
    return Documents(tuple(x for x in ordered if x < total) + (total,))
