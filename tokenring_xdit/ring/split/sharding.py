"""Where each rank's tokens come from: the zigzag split a causal ring needs, and its proof.

A causal TokenRing call is exact only on zigzag shards (rank r of N holds chunks r and 2N-1-r
of 2N equal chunks, concatenated). The shard's values cannot show where its tokens came from,
so a causal call must carry proof, checked on every rank before any transfer (ring/agree/):

- a declaration made by a sharding helper (`declare_zigzag`, called by the helpers that cut
  zigzag shards, e.g. yunchang's EXTRACT_FUNC_DICT["token_ring"] under our patch), recording
  the global sequence lengths cut per ring group (the last `DECLARED_LENGTHS` distinct ones, so
  shards cut ahead of their calls - a prefetching loader, eval batches between training
  batches - keep their proof); or
- the call's global token positions (`positions=`), verified against the zigzag split.

`shard` / `unshard` cut a full sequence into this rank's shard and put shards back together,
for any process group (no yunchang groups needed): zigzag for causal attention (and the
declaration above), contiguous otherwise. A packed row (`cu_seqlens=`) may instead be cut in the
documents layout (ring/packed/doc_split.py: every document in 2N pieces, balanced whatever the lengths)
or, causal, in contiguous shards (schedules/contiguous.py: documents stay whole where a shard holds
them); `layout="auto"` picks the layout whose slowest rank has the smallest predicted time
(`documents.document_work`, ring/packed/cost.py). `shard` declares the layout it cut for (group,
length, documents), and a packed call on those documents follows that declaration (`call_layout`),
agreed across the ring like the rest of the call.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict

import torch
import torch.distributed as dist

from ..packed.doc_split import (
    CONTIGUOUS,
    DOCUMENTS,
    LAYOUTS,
    ROW,
    check_total,
    local_positions,
    normal_split,
)
from ..packed.pick import Documents, pick_layout

__all__ = [
    "shard",
    "unshard",
    "zigzag_chunks",
    "zigzag_positions",
    "shard_positions",
    "declare_zigzag",
    "declare_layout",
    "declared_total",
    "call_layout",
    "proof_of",
]

# ring group -> the global sequence lengths its members cut zigzag shards of, oldest first
# (an ordered set; None: no group)
_DECLARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_NO_GROUP: dict[None, OrderedDict] = {}
# distinct lengths remembered per group: a bound, so a loader of ever-new lengths keeps no more
DECLARED_LENGTHS = 64
# ring group -> {(length, document bounds): the layout `shard` cut them in}, oldest first
_LAYOUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_NO_GROUP_LAYOUTS: dict[None, OrderedDict] = {}

# proof codes exchanged in the input check
NO_PROOF, DECLARED, POSITIONS = 0, 1, 2
BAD_POSITIONS = -1


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


def shard_positions(
    total: int,
    rank: int,
    world_size: int,
    *,
    causal: bool = True,
    cu_seqlens=None,
    layout: str = "auto",
    device=None,
) -> torch.Tensor:
    """Global position of every token of rank `rank`'s shard, as `shard` cuts a row of `total`
    tokens with these arguments (the zigzag split, contiguous shards, or the documents layout):
    `x_full[..., shard_positions(...)]` is the shard; the proof `positions=` of a causal call."""
    split = _split(layout, cu_seqlens, total, world_size, causal)
    if split == DOCUMENTS:
        pos = local_positions(Documents.of(cu_seqlens, total=total).bounds, rank, world_size)
        return torch.tensor(pos, dtype=torch.int64, device=device)
    if causal and world_size > 1 and split == ROW:
        return zigzag_positions(total, rank, world_size, device=device)
    size = total // _pieces(total, world_size, False)
    return torch.arange(rank * size, (rank + 1) * size, device=device)


def _split(layout: str, cu_seqlens, total: int, world_size: int, causal: bool) -> str:
    """The layout `shard` cuts: ROW, DOCUMENTS or CONTIGUOUS ("auto": the smallest predicted
    time). CONTIGUOUS of a row that is not causal (or over one rank) is the row's split."""
    if layout not in (*LAYOUTS, "auto"):
        raise ValueError(f"layout must be one of {['auto', *LAYOUTS]}, got {layout!r}")
    layout = normal_split(layout, causal, world_size)  # ("auto" stays)
    if cu_seqlens is None:
        if layout in (DOCUMENTS, CONTIGUOUS):
            raise ValueError(
                f"layout={layout!r} is for packed rows (a causal call over contiguous shards "
                "needs their documents to know which blocks attend): pass cu_seqlens="
            )
        return ROW
    docs = Documents.of(cu_seqlens, total=total)
    if layout == "auto":
        if total % (2 * world_size if causal else world_size):
            _pieces(total, world_size, causal)  # the error says how far to pad
        return pick_layout(docs, world_size, causal)
    if layout == DOCUMENTS:
        check_total(total, world_size)
    if layout == CONTIGUOUS:
        _pieces(total, world_size, False)
    return layout


def _key(group: dist.ProcessGroup | None):
    if group is None and dist.is_initialized():
        return dist.group.WORLD
    return group


def _lengths(group: dist.ProcessGroup | None, make: bool = False) -> OrderedDict | None:
    key = _key(group)
    table = _NO_GROUP if key is None else _DECLARED
    if make and key not in table:
        table[key] = OrderedDict()
    return table.get(key)


def declare_zigzag(group: dist.ProcessGroup | None, total: int) -> None:
    """Record that this rank cut zigzag shards of `total` tokens for `group` (kept with the
    group's last `DECLARED_LENGTHS` distinct lengths)."""
    lengths = _lengths(group, make=True)
    lengths.pop(int(total), None)
    lengths[int(total)] = None  # newest last
    while len(lengths) > DECLARED_LENGTHS:
        lengths.popitem(last=False)


def declare_layout(group: dist.ProcessGroup | None, total: int, docs: Documents, split: str):
    """Record that this rank cut the packed row `docs` of `total` tokens in layout `split` for
    `group` (the last `DECLARED_LENGTHS` rows kept); a packed call on these documents follows
    it (`call_layout`)."""
    key = _key(group)
    table = _NO_GROUP_LAYOUTS if key is None else _LAYOUTS
    if key not in table:
        table[key] = OrderedDict()
    rows = table[key]
    rows.pop((int(total), docs.bounds), None)
    rows[(int(total), docs.bounds)] = split
    while len(rows) > DECLARED_LENGTHS:
        rows.popitem(last=False)


def declared_layout(group: dist.ProcessGroup | None, total: int, docs: Documents) -> str | None:
    """The layout `shard` declared for these documents of `total` tokens on `group`, or None."""
    key = _key(group)
    rows = (_NO_GROUP_LAYOUTS if key is None else _LAYOUTS).get(key)
    return None if rows is None else rows.get((int(total), docs.bounds))


def call_layout(
    group: dist.ProcessGroup | None, docs: Documents | None, requested: str | None, total: int
) -> tuple[str, str]:
    """(layout of a packed call's shards, "" or why it cannot be): `requested` (the call's
    doc_layout) or, with None, what `shard` declared for these documents (the row's split if
    nothing was). A request that contradicts the declaration is refused."""
    if requested is not None and requested not in LAYOUTS:
        return ROW, f"doc_layout must be None or one of {list(LAYOUTS)}, got {requested!r}"
    if docs is None:
        if requested in (DOCUMENTS, CONTIGUOUS):
            return ROW, (
                f"doc_layout={requested!r} needs the documents as cu_seqlens of the whole row "
                "(position_ids that restart cannot place the pieces)"
            )
        return ROW, ""
    declared = declared_layout(group, total, docs)
    if requested is None:
        return declared or ROW, ""
    if declared is not None and declared != requested:
        return requested, (
            f"doc_layout={requested!r} but these shards were cut in the {declared!r} layout "
            f"(shard(..., cu_seqlens=, layout=) declared it for this group); pass "
            f"doc_layout={declared!r} or None (None follows the declaration)"
        )
    return requested, ""


def declared_total(group: dist.ProcessGroup | None, total: int | None = None) -> int | None:
    """`total` if zigzag shards of that many tokens were declared for `group`; else (or with
    total=None) the last length declared, None if none was: the input check then names it."""
    lengths = _lengths(group)
    if not lengths:
        return None
    return total if total in lengths else next(reversed(lengths))


def _positions_total(positions: torch.Tensor, rank: int, world_size: int, q_len: int) -> int:
    """The total length `positions` proves a zigzag shard of, or BAD_POSITIONS."""
    pos = positions.reshape(-1, positions.shape[-1]) if positions.dim() > 1 else positions[None]
    if pos.shape[-1] != q_len or q_len % 2:
        return BAD_POSITIONS
    total = q_len * world_size
    want = zigzag_positions(total, rank, world_size, device=pos.device)
    # one host sync: the positions are usually on the GPU (docs: the measured cost)
    return total if bool((pos == want).all()) else BAD_POSITIONS


def proof_of(
    group: dist.ProcessGroup | None,
    positions: torch.Tensor | None,
    rank: int,
    world_size: int,
    q_len: int,
    docs: Documents | None = None,
    split: str = ROW,
) -> tuple[int, int]:
    """(proof code, proven global length) of a causal call's layout on this rank (`split`:
    the documents layout of `docs`, proven by positions or by `shard`'s declaration)."""
    if split in (DOCUMENTS, CONTIGUOUS):
        total = q_len * world_size
        if positions is not None:
            want = shard_positions(total, rank, world_size, cu_seqlens=docs.bounds,
                                   layout=split, device=positions.device)  # fmt: skip
            pos = positions.reshape(-1, positions.shape[-1])
            ok = pos.shape[-1] == q_len and bool((pos == want).all())
            return (POSITIONS, total) if ok else (BAD_POSITIONS, 0)
        declared = declared_layout(group, total, docs) == split
        return (DECLARED, total) if declared else (NO_PROOF, 0)
    if positions is not None:
        total = _positions_total(positions, rank, world_size, q_len)
        return (POSITIONS, total) if total >= 0 else (BAD_POSITIONS, 0)
    # equal halves on every rank: a zigzag split of q_len * world_size tokens, if declared
    total = declared_total(group, q_len * world_size)
    return (DECLARED, total) if total is not None else (NO_PROOF, 0)


# --- the sharding helpers of the functional API ----------------------------------------------


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


def shard(
    x: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    *,
    causal: bool,
    dim: int = 1,
    cu_seqlens=None,
    layout: str = "auto",
) -> torch.Tensor:
    """This rank's shard of the full sequence `x` (sequence along `dim`) for ring `group`.

    causal=True: the zigzag shard TokenRing's causal path needs (chunks r and 2N-1-r of 2N equal
    chunks, concatenated) and a declaration for `group` (`declare_zigzag`) that proves the
    layout to the causal input check. causal=False: the r-th of N contiguous equal shards.
    Call it on every rank of `group` with the same full `x` shape; group=None is the default
    group. The length must divide by 2N (causal) or N: pad it first (the error says how far).

    Packed rows: `cu_seqlens` (document offsets in the full row) and `layout`: "zigzag" (the
    row's split above), "documents" (every document cut into 2N pieces, rank r holding pieces
    r and 2N-1-r of each: ring/packed/doc_split.py; the length must divide by 2N), "contiguous" (a
    causal row in N contiguous shards: documents stay whole where a shard holds them,
    schedules/contiguous.py; pack the row in `pack_order.balanced_order(...,
    split="contiguous")` to even the ranks) or "auto" (the one of smallest predicted time,
    `document_work`; equal on every rank). The layout is declared
    for (group, length, documents): a call with these cu_seqlens follows it. Position ids and
    labels follow `shard_positions` (or shard them with the same arguments).
    """
    rank, n = _rank_and_size(group)
    dim = dim % x.dim()
    total = x.shape[dim]
    split = _split(layout, cu_seqlens, total, n, causal)
    if split == DOCUMENTS:
        declare_layout(group, total, Documents.of(cu_seqlens), DOCUMENTS)
        pos = shard_positions(total, rank, n, cu_seqlens=cu_seqlens, layout=DOCUMENTS)
        return x.index_select(dim, pos.to(x.device))
    size = total // _pieces(total, n, causal and split == ROW)
    if cu_seqlens is not None:
        declare_layout(group, total, Documents.of(cu_seqlens), split)
    if not causal or split == CONTIGUOUS:
        return x.narrow(dim, rank * size, size)
    front, back = zigzag_chunks(rank, n)
    declare_zigzag(group, total)
    return torch.cat([x.narrow(dim, front * size, size), x.narrow(dim, back * size, size)], dim)


def unshard(
    x: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    *,
    causal: bool,
    dim: int = 1,
    cu_seqlens=None,
    layout: str = "auto",
) -> torch.Tensor:
    """The full sequence from every rank's shard `x` (as `shard` cut it, with the same
    `causal`, `cu_seqlens` and `layout`), on every rank.

    An all-gather over `group` (every rank calls it, shards of one shape): for outputs, logits
    and checks. No gradient flows back through it.
    """
    rank, n = _rank_and_size(group)
    dim = dim % x.dim()
    if n == 1 and cu_seqlens is None:
        return x
    total = x.shape[dim] * n
    split = _split(layout, cu_seqlens, total, n, causal)
    if causal and split == ROW and x.shape[dim] % 2:
        raise ValueError(
            f"unshard(causal=True) takes zigzag shards (two equal halves); got a shard of "
            f"{x.shape[dim]} tokens along dim {dim}"
        )
    shards = [x]
    if n > 1:
        shards = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(shards, x.contiguous(), group=group)
    if split == DOCUMENTS:
        where = torch.cat([shard_positions(total, r, n, cu_seqlens=cu_seqlens,
                                           layout=DOCUMENTS) for r in range(n)])  # fmt: skip
        return torch.cat(shards, dim).index_select(dim, torch.argsort(where).to(x.device))
    if not causal or n == 1 or split == CONTIGUOUS:
        return torch.cat(shards, dim)
    halves = [s.chunk(2, dim) for s in shards]
    # chunk c of 2N: rank c's front half (c < N), else rank 2N-1-c's back half
    chunks = [halves[c][0] if c < n else halves[2 * n - 1 - c][1] for c in range(2 * n)]
    return torch.cat(chunks, dim)
