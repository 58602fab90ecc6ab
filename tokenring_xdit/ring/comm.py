"""The two P2P lanes of TokenRing and the extra communicators they need.

Q travels on the ring group itself; returned partials travel on a second communicator made for
that ring at set-up time, so both transfers run at once (on NCCL: separate streams). Groups are
made collectively, on all ranks, in the same order, never inside a forward.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class TrafficCounters:
    """P2P messages and bytes posted by this process (tests assert the schedule with these)."""

    q_messages: int = 0
    partial_messages: int = 0
    bytes_sent: int = 0
    kernel_calls: int = 0
    handshakes: int = 0
    by_peer: dict[int, int] = field(default_factory=dict)

    def reset(self) -> None:
        self.__init__()


COUNTERS = TrafficCounters()


@dataclass(frozen=True)
class RingPosition:
    """This process's place in a ring: the group (None without torch.distributed), its rank
    there and the ring size."""

    group: dist.ProcessGroup | None
    rank: int
    size: int

    @classmethod
    def of(cls, group: dist.ProcessGroup | None) -> RingPosition:
        if not dist.is_initialized():
            if group is not None:
                raise ValueError(
                    "TokenRing: a group was given but torch.distributed is not initialized"
                )
            return cls(None, 0, 1)
        group = group if group is not None else dist.group.WORLD
        rank = dist.get_rank(group)
        if rank < 0:
            raise ValueError(
                f"TokenRing: global rank {dist.get_rank()} is not a member of the given group "
                f"(ranks {dist.get_process_group_ranks(group)}); pass this rank's own ring group"
            )
        return cls(group, rank, dist.get_world_size(group))


# ring group -> communicator for returned partials; weak keys, so a destroyed group's entry
# cannot be found again by a new group that reuses its name
_OUT_GROUPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def setup_token_ring_group(group: dist.ProcessGroup | None) -> None:
    """Create the out-lane communicator of `group` (and of every other rank's ring group).

    Collective over the default group: every process calls it once after its ring group exists
    (a rank outside any ring passes None). Calling it again for a ready group is a no-op on every
    rank, because the decision is taken from the gathered state, not the local one.
    """
    mine = None
    if group is not None and dist.get_world_size(group) > 1:
        mine = (tuple(dist.get_process_group_ranks(group)), group in _OUT_GROUPS)
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    todo = sorted({ranks for item in gathered if item for ranks, ready in [item] if not ready})
    for ranks in todo:  # same order on every rank: new_group is collective over the world
        out_group = dist.new_group(list(ranks))
        if mine is not None and ranks == mine[0] and not mine[1]:
            _OUT_GROUPS[group] = out_group


def out_group_for(group: dist.ProcessGroup) -> dist.ProcessGroup:
    try:
        return _OUT_GROUPS[group]
    except KeyError:
        raise ValueError(
            "TokenRing has no return communicator for this ring group: create the group through "
            "yunchang.set_seq_parallel_pg (patched by tokenring_xdit) or call "
            "tokenring_xdit.setup_token_ring_group(group) on every rank right after creating it "
            f"(group ranks {dist.get_process_group_ranks(group)})"
        ) from None


_GLOBAL_RANKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _global_ranks(group: dist.ProcessGroup) -> tuple[int, ...]:
    """Group rank -> global rank, looked up once per group (it is on every P2P op's path)."""
    ranks = _GLOBAL_RANKS.get(group)
    if ranks is None:
        ranks = _GLOBAL_RANKS[group] = tuple(dist.get_process_group_ranks(group))
    return ranks


class Lane:
    """P2P transfers on one communicator: post a batch, wait for all of it later."""

    def __init__(self, group: dist.ProcessGroup):
        self.group = group
        self._global = _global_ranks(group)
        self._works: list = []

    def post(
        self,
        sends: list[tuple[torch.Tensor, int]],
        recvs: list[tuple[torch.Tensor, int]],
        what: str,
    ) -> list:
        """Issue sends/recvs (tensor, group rank) now; `wait` completes them.

        `what` is "q" or "partial" (a partial = its out and its lse: two messages), for counters.
        """
        ops = [dist.P2POp(dist.isend, t, self._global[p], self.group) for t, p in sends]
        ops += [dist.P2POp(dist.irecv, t, self._global[p], self.group) for t, p in recvs]
        if not ops:
            return []
        works = dist.batch_isend_irecv(ops)
        self._works.extend(works)
        if what == "q":
            COUNTERS.q_messages += len(sends)
        else:
            COUNTERS.partial_messages += len(sends)
        for t, p in sends:
            COUNTERS.bytes_sent += t.numel() * t.element_size()
            COUNTERS.by_peer[p] = COUNTERS.by_peer.get(p, 0) + 1
        return works

    def wait(self, works: list | None = None) -> None:
        """Wait for `works` (one post's handles), or for everything posted so far."""
        if works is None:
            works, self._works = self._works, []
        else:
            self._works = [w for w in self._works if all(w is not x for x in works)]
        for work in works:
            work.wait()
