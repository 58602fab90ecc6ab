"""Host-side bookkeeping of the IPC transport: where flag words and message bytes live, and when
a receive buffer grows. Pure functions (no CUDA): both ends of a pair compute the same answers
from the same message sizes, which is what keeps them in step without extra messages.

Per lane and ordered pair (sender s, receiver r) there is one receive buffer ("inbox", owned by r)
and two 32-bit flag words, each written remotely by one side and waited for locally by the other:
- READY in r's flag page: s sets it to 1 after its copy into the inbox has landed; r waits for 1,
  resets it to 0, copies the message out, then clears TAKEN.
- TAKEN in s's flag page: s waits for 0 (the inbox is free), sets it to 1, copies; r sets it back
  to 0 once it has copied the message out.
Values never depend on a step number, so the same stream operations could be replayed by a graph.
"""

from __future__ import annotations

__all__ = [
    "ALIGN",
    "LANES",
    "READY",
    "TAKEN",
    "grown_capacity",
    "pack",
    "page_bytes",
    "word_offset",
]

LANES = 2  # 0: the Q lane (Q, or the backward's bundle; the last partials), 1: the return lane
READY, TAKEN = 0, 1
WORD = 4
ALIGN = 256  # message pieces start on 256-byte boundaries (copy engines like aligned addresses)
_GRANULE = 1 << 20  # inboxes grow in whole MiB


def word_offset(lane: int, peer: int, kind: int, size: int) -> int:
    """Byte offset of the (lane, peer, kind) flag word in a rank's flag page (ring of `size`)."""
    if not (0 <= lane < LANES and 0 <= peer < size and kind in (READY, TAKEN)):
        raise ValueError(f"no flag word ({lane}, {peer}, {kind}) in a ring of {size}")
    return ((lane * size + peer) * 2 + kind) * WORD


def page_bytes(size: int) -> int:
    """Bytes of a flag page for a ring of `size` (every lane, peer and kind)."""
    return _round_up(LANES * size * 2 * WORD, ALIGN)


def pack(nbytes: list[int]) -> tuple[list[int], int]:
    """Offsets of a message's pieces in an inbox, and the bytes the message needs."""
    offsets, end = [], 0
    for n in nbytes:
        if n < 0:
            raise ValueError(f"negative message size {n}")
        offsets.append(end)
        end = _round_up(end + n, ALIGN)
    return offsets, end


def grown_capacity(needed: int, current: int) -> int:
    """The new capacity of an inbox that must hold `needed` bytes, or 0 when `current` does.

    Doubling (at least) keeps regrowth rare when lengths creep up, e.g. a growing KV cache.
    """
    if needed <= current:
        return 0
    return _round_up(max(needed, 2 * current), _GRANULE)


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to
