"""Cutting a sequence across the ring and putting it back: `make_split`, `shard`, `unshard`,
`shard_positions`.

A causal TokenRing call is exact only on zigzag shards, and a shard's values cannot show where
its tokens came from: the call takes the `Split` its shards were cut by (`split=`,
ring/split/value.py) or their global positions (`positions=`). `make_split` cuts zigzag for
causal attention, contiguous otherwise; a packed row (`cu_seqlens`) may instead be cut in the
documents layout or, causal, in contiguous shards (ring/packed/), `layout="auto"` picking the
one of smallest predicted time. `shard` / `unshard` work for any process group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..packed import CONTIGUOUS as CONTIGUOUS_LAYOUT
from ..packed import DOCUMENTS as DOCUMENTS_LAYOUT
from ..packed import LAYOUTS, ROW, check_total, local_positions, pick_layout
from .value import CONTIGUOUS, CUT, DOCUMENTS, PLAIN, ZIGZAG, Documents, Split

__all__ = [
    "make_split", "shard", "unshard", "zigzag_chunks", "zigzag_positions", "shard_positions",
]  # fmt: skip


def zigzag_chunks(rank: int, world_size: int) -> tuple[int, int]:
    """The two chunk indices (of 2N) rank `rank` holds."""
    return rank, 2 * world_size - 1 - rank


def zigzag_positions(total: int, rank: int, world_size: int, device=None) -> torch.Tensor:
    """Global positions of the tokens of rank `rank`'s zigzag shard of `total` tokens."""
    if total % (2 * world_size):
        raise ValueError(
            f"a zigzag split of {total} tokens over {world_size} ranks needs a multiple of "
            f"2 x {world_size} = {2 * world_size} tokens; pad the sequence"
        )
    c = total // (2 * world_size)
    front, back = zigzag_chunks(rank, world_size)
    return torch.cat(
        [torch.arange(front * c, (front + 1) * c), torch.arange(back * c, (back + 1) * c)]
    ).to(device)


def _pieces(total: int, world_size: int, causal: bool) -> int:
    """Equal pieces the sequence is cut into (2N zigzag chunks, or N contiguous shards)."""
    pieces = 2 * world_size if causal else world_size
    if total % pieces:
        kind = "a causal (zigzag) split" if causal else "a contiguous split"
        raise ValueError(
            f"{kind} of {total} tokens over {world_size} ranks needs a multiple of {pieces} "
            f"tokens ({'2 x ' if causal else ''}ring size); pad the sequence to "
            f"{-(-total // pieces) * pieces} tokens (e.g. with the tokenizer's pad id and "
            "labels = -100)"
        )
    return pieces


def _layout(layout: str, docs: Documents | None, total: int, n: int, causal: bool) -> str:
    """The packed layout `make_split` cuts (ring/packed's names; "auto": the smallest
    predicted time), after the length checks each layout needs."""
    if layout not in (*LAYOUTS, "auto"):
        raise ValueError(f"layout must be one of {['auto', *LAYOUTS]}, got {layout!r}")
    if layout == CONTIGUOUS_LAYOUT and not (causal and n > 1):
        layout = ROW  # contiguous shards of a row that is not causal are the row's split
    if docs is None:
        if layout == DOCUMENTS_LAYOUT:
            raise ValueError(
                "layout='documents' is for packed rows (every document is cut in 2N pieces): "
                "pass cu_seqlens= (a dense row is one document: its pieces are the zigzag's)"
            )
        layout = CONTIGUOUS_LAYOUT if layout == CONTIGUOUS_LAYOUT else ROW
    if layout == "auto":
        _pieces(total, n, causal)  # the error says how far to pad
        return pick_layout(docs, n, causal)
    if layout == DOCUMENTS_LAYOUT:
        check_total(total, n)
    else:
        _pieces(total, n, causal and n > 1 and layout == ROW)
    return layout


def make_split(
    total: int, world_size: int, *, causal: bool, cu_seqlens=None, layout: str = "auto"
) -> Split:
    """How `total` tokens are cut over `world_size` ranks, for `shard`, `unshard`,
    `shard_positions` and the call (`split=`), equal on every rank: causal, zigzag (chunks r and
    2N-1-r of 2N); else N contiguous shards. Packed rows (`cu_seqlens`, offsets in the full
    row) by `layout`: "zigzag" (as above), "documents" (every document in 2N pieces),
    "contiguous" (a causal row in N contiguous shards; `packed.balanced_order(...,
    split="contiguous")` evens them) or "auto" (the smallest predicted time). A dense row may
    be cut "contiguous" too (causal: the split holds it as one document). The errors say how
    far to pad."""
    docs = None if cu_seqlens is None else Documents.of(cu_seqlens, total=total)
    found = _layout(layout, docs, total, world_size, causal)
    if found == CONTIGUOUS_LAYOUT and docs is None:
        docs = Documents((0, total))  # a dense row is one document (which blocks attend)
    if found == DOCUMENTS_LAYOUT:
        kind = DOCUMENTS
    elif found == CONTIGUOUS_LAYOUT or not (causal and world_size > 1):
        kind = CONTIGUOUS
    else:
        kind = ZIGZAG
    return Split(kind=kind, total=total, world_size=world_size, docs=docs, proof=CUT)


def _rank_and_size(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """(rank, size) of this process in `group` (None: the default group; 1 process without
    torch.distributed)."""
    if not dist.is_initialized():
        if group is not None:
            raise ValueError("a group was given but torch.distributed is not initialized")
        return 0, 1
    group = group if group is not None else dist.group.WORLD
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(
            f"global rank {dist.get_rank()} is not a member of the given group (ranks "
            f"{dist.get_process_group_ranks(group)}); pass this rank's own ring group"
        )
    return rank, dist.get_world_size(group)


def _split_for(split: Split | None, total: int, n: int, cut: dict) -> Split:
    """The split of a `shard` / `unshard` call: `split`, checked against the group and the
    length, or made from the old keywords (`cut`: causal, cu_seqlens, layout)."""
    if split is None:
        if cut.get("causal") is None:
            raise TypeError("pass split= (tokenring_xdit.make_split) or causal=")
        return make_split(total, n, **cut)
    if cut.get("causal") is not None or cut.get("cu_seqlens") is not None:
        raise TypeError("pass split= alone: it already says how the sequence is cut")
    if split.kind == PLAIN:
        raise ValueError("a plain split says nothing of where tokens are: use make_split(...)")
    if (split.world_size, split.total) != (n, total):
        raise ValueError(
            f"the split is {split.words}, but this group has {n} ranks and the sequence "
            f"{total} tokens; make the split for this group and sequence"
        )
    return split


def shard_positions(
    split: Split | int, rank: int, world_size: int | None = None, *, causal: bool = True,
    cu_seqlens=None, layout: str = "auto", device=None,
) -> torch.Tensor:  # fmt: skip
    """Global position of every token of rank `rank`'s shard under `split` (or, the old form,
    of the split `make_split(total, world_size, causal=, cu_seqlens=, layout=)` makes):
    `x_full[..., shard_positions(split, rank)]` is the shard; the proof `positions=` of a
    causal call."""
    if not isinstance(split, Split):
        split = make_split(split, world_size, causal=causal, cu_seqlens=cu_seqlens, layout=layout)
    n, total = split.world_size, split.total
    if split.kind == DOCUMENTS:
        return torch.tensor(local_positions(split.docs.bounds, rank, n), device=device)
    if split.kind == ZIGZAG:
        return zigzag_positions(total, rank, n, device=device)
    if split.kind == PLAIN:
        raise ValueError("a plain split says nothing of where tokens are: use make_split(...)")
    return torch.arange(rank * (total // n), (rank + 1) * (total // n), device=device)


def shard(
    x: torch.Tensor, group: dist.ProcessGroup | None = None, *, split: Split | None = None,
    causal: bool | None = None, dim: int = 1, cu_seqlens=None, layout: str = "auto",
) -> torch.Tensor:  # fmt: skip
    """This rank's shard of the full sequence `x` (sequence along `dim`) for ring `group`, cut
    by `split` (`make_split(x.shape[dim], N, ...)`; pass the same split to the call as
    `split=`), or by the split the old keywords `causal`, `cu_seqlens`, `layout` make. Call it
    on every rank of `group` with the same full `x` shape; group=None is the default group.
    Position ids and labels follow `shard_positions` (or shard them with the same split)."""
    rank, n = _rank_and_size(group)
    dim = dim % x.dim()
    cut = dict(causal=causal, cu_seqlens=cu_seqlens, layout=layout)
    split = _split_for(split, x.shape[dim], n, cut)
    if split.kind == DOCUMENTS:
        return x.index_select(dim, shard_positions(split, rank).to(x.device))
    if split.kind == CONTIGUOUS:
        size = split.total // n
        return x.narrow(dim, rank * size, size)
    size = split.total // (2 * n)
    front, back = zigzag_chunks(rank, n)
    return torch.cat([x.narrow(dim, front * size, size), x.narrow(dim, back * size, size)], dim)


def unshard(
    x: torch.Tensor, group: dist.ProcessGroup | None = None, *, split: Split | None = None,
    causal: bool | None = None, dim: int = 1, cu_seqlens=None, layout: str = "auto",
) -> torch.Tensor:  # fmt: skip
    """The full sequence from every rank's shard `x` (as `shard` cut it, with the same split or
    keywords), on every rank. An all-gather over `group` (every rank calls it, shards of one
    shape): for outputs, logits and checks. No gradient flows back through it."""
    _, n = _rank_and_size(group)
    dim = dim % x.dim()
    cut = dict(causal=causal, cu_seqlens=cu_seqlens, layout=layout)
    split = _split_for(split, x.shape[dim] * n, n, cut)
    shards = [x]
    if n > 1:
        shards = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(shards, x.contiguous(), group=group)
    if split.kind == DOCUMENTS:
        where = torch.cat([shard_positions(split, r) for r in range(n)])
        return torch.cat(shards, dim).index_select(dim, torch.argsort(where).to(x.device))
    if split.kind == CONTIGUOUS:
        return torch.cat(shards, dim)
    halves = [s.chunk(2, dim) for s in shards]
    # chunk c of 2N: rank c's front half (c < N), else rank 2N-1-c's back half
    chunks = [halves[c][0] if c < n else halves[2 * n - 1 - c][1] for c in range(2 * n)]
    return torch.cat(chunks, dim)
