"""Block steps: a schedule row that also says WHICH part of Q and K/V a step's kernel covers.

The training loop (`ring/training/block_loop.py`, forward and backward) runs tables of these. A causal
zigzag shard is two halves of the sequence (chunks r and 2N-1-r), so a part is the whole local
sequence (ALL) or one half of it (FRONT = chunk r, BACK = chunk 2N-1-r).

The plan has one row per kernel step and, for N > 1, one more row (`kernel=False`) that only
returns the last partial: the loops treat "the previous step's partial goes home" uniformly.

Backward payloads (same rows, same peers): the Q lane carries (Q, dO, lse, delta) of the held
part instead of Q; the return lane carries the dQ partial instead of (out, lse); dK/dV of the
local K/V part are accumulated where they are computed and never travel.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

ALL, FRONT, BACK = "all", "front", "back"


@dataclass(frozen=True)
class Rows:
    """A part that is the first `n` positions of a local sequence: what a packed plan trims a
    travelling query to when later holders need only its first documents' rows
    (doc_blocks.py, the contiguous layout). Taken out of ALL or of a longer Rows."""

    n: int


Part = str | Rows


@dataclass(frozen=True)
class BlockStep:
    """What rank `rank` does at `step`; parts are ALL / FRONT / BACK of a local sequence."""

    step: int
    kernel: bool  # False on the return-only row after the last kernel step
    q_owner: int | None  # owner of the held Q the kernel runs on
    q_part: Part  # part of the owner's sequence that is held (and that the kernel runs on)
    kv_part: str  # part of the local K/V the kernel runs on
    causal: bool  # the diagonal block: our own Q against our own K/V, causally masked
    q_send_to: int | None = None  # Q lane: forward a part of the held Q for the next step
    q_send_part: Part = ALL
    q_recv_from: int | None = None
    q_recv_owner: int | None = None  # whose Q arrives (its length sizes the receive buffer)
    q_recv_part: Part = ALL
    ret_send_to: int | None = None  # return lane: the previous step's partial goes home
    ret_send_part: Part = ALL  # part of its owner's sequence that partial covers
    ret_recv_from: int | None = None  # who computed the partial of our own Q that arrives now
    ret_recv_part: Part = ALL  # part of OUR sequence that arriving partial covers


def part_slice(part: Part, length: int) -> slice:
    """The positions of `part` in a local sequence of `length` (even when split in halves)."""
    if part == ALL:
        return slice(0, length)
    if isinstance(part, Rows):
        return slice(0, min(part.n, length))
    half = length // 2
    return slice(0, half) if part == FRONT else slice(half, length)


def part_len(part: Part, length: int) -> int:
    s = part_slice(part, length)
    return s.stop - s.start


def sub_slice(held: Part, wanted: Part, length: int) -> slice:
    """Positions of `wanted` inside a tensor that holds `held` of a sequence of `length`."""
    if held == wanted:
        return slice(0, part_len(held, length))
    if isinstance(wanted, Rows) and (held == ALL or isinstance(held, Rows)):
        if part_len(wanted, length) > part_len(held, length):
            raise ValueError(f"cannot take {wanted!r} out of a held {held!r} part")
        return slice(0, part_len(wanted, length))  # a prefix of a prefix
    if held != ALL:
        raise ValueError(f"cannot take {wanted!r} out of a held {held!r} part")
    return part_slice(wanted, length)


@functools.cache
def lift_non_causal(rank: int, world_size: int) -> tuple[BlockStep, ...]:
    """The non-causal TokenRing table (schedules/token_ring.py) as block steps: every part ALL,
    the last partial returned on a row of its own (no chunking)."""
    from .token_ring import final_return, steps

    plan = [
        BlockStep(
            step=st.step,
            kernel=True,
            q_owner=st.q_owner,
            q_part=ALL,
            kv_part=ALL,
            causal=False,
            q_send_to=st.q_send_to,
            q_recv_from=st.q_recv_from,
            q_recv_owner=st.q_recv_owner,
            ret_send_to=st.ret_send_to,
            ret_recv_from=st.ret_recv_from,
        )
        for st in steps(rank, world_size)
    ]
    last = final_return(rank, world_size)
    if last is not None:
        plan.append(
            BlockStep(
                world_size, False, None, ALL, ALL, False, ret_send_to=last[0], ret_recv_from=last[1]
            )
        )
    return tuple(plan)


@dataclass(frozen=True)
class BlockSchedule:
    """A schedule object the training loop takes: its name, whether its step-0 block is the
    causal diagonal, and its table `block_steps(rank, world_size)`."""

    name: str
    causal: bool
    block_steps: Callable[[int, int], tuple[BlockStep, ...]]


NON_CAUSAL_BLOCKS = BlockSchedule("token_ring", False, lift_non_causal)
