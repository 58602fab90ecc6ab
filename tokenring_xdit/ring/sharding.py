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
declaration above), contiguous otherwise.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict

import torch
import torch.distributed as dist

__all__ = [
    "shard",
    "unshard",
    "zigzag_chunks",
    "zigzag_positions",
    "declare_zigzag",
    "declared_total",
    "proof_of",
]

# ring group -> the global sequence lengths its members cut zigzag shards of, oldest first
# (an ordered set; None: no group)
_DECLARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_NO_GROUP: dict[None, OrderedDict] = {}
# distinct lengths remembered per group: a bound, so a loader of ever-new lengths keeps no more
DECLARED_LENGTHS = 64

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
) -> tuple[int, int]:
    """(proof code, proven global length) of a causal call's layout on this rank."""
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
    x: torch.Tensor, group: dist.ProcessGroup | None = None, *, causal: bool, dim: int = 1
) -> torch.Tensor:
    """This rank's shard of the full sequence `x` (sequence along `dim`) for ring `group`.

    causal=True: the zigzag shard TokenRing's causal path needs (chunks r and 2N-1-r of 2N equal
    chunks, concatenated) and a declaration for `group` (`declare_zigzag`) that proves the
    layout to the causal input check. causal=False: the r-th of N contiguous equal shards.
    Call it on every rank of `group` with the same full `x` shape; group=None is the default
    group. The length must divide by 2N (causal) or N: pad it first (the error says how far).
    """
    rank, n = _rank_and_size(group)
    dim = dim % x.dim()
    total = x.shape[dim]
    size = total // _pieces(total, n, causal)
    if not causal:
        return x.narrow(dim, rank * size, size)
    front, back = zigzag_chunks(rank, n)
    declare_zigzag(group, total)
    return torch.cat([x.narrow(dim, front * size, size), x.narrow(dim, back * size, size)], dim)


def unshard(
    x: torch.Tensor, group: dist.ProcessGroup | None = None, *, causal: bool, dim: int = 1
) -> torch.Tensor:
    """The full sequence from every rank's shard `x` (as `shard` cut it), on every rank.

    An all-gather over `group` (every rank calls it, shards of one shape): for outputs, logits
    and checks. No gradient flows back through it.
    """
    rank, n = _rank_and_size(group)
    dim = dim % x.dim()
    if n == 1:
        return x
    if causal and x.shape[dim] % 2:
        raise ValueError(
            f"unshard(causal=True) takes zigzag shards (two equal halves); got a shard of "
            f"{x.shape[dim]} tokens along dim {dim}"
        )
    shards = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(shards, x.contiguous(), group=group)
    if not causal:
        return torch.cat(shards, dim)
    halves = [s.chunk(2, dim) for s in shards]
    # chunk c of 2N: rank c's front half (c < N), else rank 2N-1-c's back half
    chunks = [halves[c][0] if c < n else halves[2 * n - 1 - c][1] for c in range(2 * n)]
    return torch.cat(chunks, dim)
