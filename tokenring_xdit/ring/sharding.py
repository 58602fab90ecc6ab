"""Where each rank's tokens come from: the zigzag split a causal ring needs, and its proof.

A causal TokenRing call is exact only on zigzag shards (rank r of N holds chunks r and 2N-1-r
of 2N equal chunks, concatenated). The shard's values cannot show where its tokens came from,
so a causal call must carry proof, checked on every rank before any transfer (ring/checks.py):

- a declaration made by a sharding helper (`declare_zigzag`, called by the helpers that cut
  zigzag shards, e.g. yunchang's EXTRACT_FUNC_DICT["token_ring"] under our patch), recording
  the global sequence length per ring group; or
- the call's global token positions (`positions=`), verified against the zigzag split.
"""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist

__all__ = ["zigzag_chunks", "zigzag_positions", "declare_zigzag", "declared_total", "proof_of"]

# ring group -> global sequence length its members last cut zigzag shards of (None: no group)
_DECLARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_NO_GROUP: dict[None, int] = {}

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


def declare_zigzag(group: dist.ProcessGroup | None, total: int) -> None:
    """Record that this rank's shards for `group` are a zigzag split of `total` tokens."""
    key = _key(group)
    if key is None:
        _NO_GROUP[None] = int(total)
    else:
        _DECLARED[key] = int(total)


def declared_total(group: dist.ProcessGroup | None) -> int | None:
    key = _key(group)
    return _NO_GROUP.get(None) if key is None else _DECLARED.get(key)


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
    total = declared_total(group)
    return (DECLARED, total) if total is not None else (NO_PROOF, 0)
