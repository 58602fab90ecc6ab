"""The exchange of headers on a ring's CPU check communicator, and the agreement's caches.

One small all-gather per exchange, bounded by the call's deadline; it never synchronises the
GPU and never shares a group with the host's collectives. Caches key on agreed values only.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...caches import Lru
from ..comm import COUNTERS, RingComms, TokenRingCommError
from ..comm.groups import describe_peer
from ..comm.teardown import on_release
from .header import Header

# what ranks agreed, by the agreed key: the last 256 keys (rings, choices)
AGREED = Lru(256)


def cached(key):
    return AGREED.get(key)


def remember(key, value) -> None:
    # keys and rings hold their group: a release lets them go (every group's: the cache is small)
    on_release(_forget_agreed)
    AGREED.put(key, value)


def _forget_agreed(group) -> None:
    AGREED.clear()


def always(validate: str, device_type: str) -> bool:
    """True when this call exchanges headers whatever the caches hold (RingConfig.validate)."""
    return validate == "always" or (validate == "auto" and device_type == "cpu")


def exchange(comms: RingComms, rank: int, header: Header) -> list[Header]:
    """Every ring rank's header, in ring order (TokenRingCommError past the deadline)."""
    header.group = comms.name
    mine = torch.tensor(header.row(), dtype=torch.int64)
    everyone = [torch.empty_like(mine) for _ in comms.ranks]
    try:  # CPU: no GPU synchronisation; bounded by this call's deadline
        work = dist.all_gather(everyone, mine, group=comms.check, async_op=True)
        work.wait(comms.deadline)
    except RuntimeError as exc:
        others = [g for r, g in enumerate(comms.ranks) if r != rank]
        who = f"global rank {others[0]}" if len(others) == 1 else f"one of global ranks {others}"
        message = (
            f"TokenRing input check (before step 0) failed on {describe_peer(comms, rank)}: "
            f"{who} of the ring (global ranks {list(comms.ranks)}) did not take part within "
            f"{comms.deadline.total_seconds():.0f} s "
            f"({str(exc).strip().splitlines()[0][:200]}); likely causes: that rank raised or "
            "exited before this call (see its log), called TokenRing fewer times, passed a "
            "different group, or runs with TOKENRING_XDIT_VALIDATE=signature while its shapes "
            "changed alone"
        )
        comms.fail(message)
        raise TokenRingCommError(message) from exc
    COUNTERS.handshakes += 1
    headers = [Header.of_row(row) for row in torch.stack(everyone).tolist()]
    _raise_group(headers, comms)
    return headers


def _raise_group(headers: list[Header], comms: RingComms) -> None:
    names = [h.group for h in headers]
    if len(set(names)) > 1:
        raise ValueError(
            f"TokenRing: the ranks of the ring of global ranks {list(comms.ranks)} passed "
            f"different process groups with the same ranks (group digests {names}); pass the "
            "same group object on every rank (the one new_group returned for these ranks)"
        )
