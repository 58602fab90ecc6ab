"""The two P2P lanes of TokenRing, the extra communicators they need, and bounded waits.

Q travels on the ring group itself; returned partials travel on a second communicator of the
same ranks, so both transfers run at once (on NCCL: separate streams); the input check of an
NCCL ring runs on a third, CPU (gloo) one, so it never synchronises the GPU. They are made for
a ring the first time it is used (or by `setup_token_ring_group`), by the ring's members only
(`use_local_synchronization`), with the ring group's timeout, so any group works and every wait
ends within that timeout. A failed or timed-out transfer raises `TokenRingCommError` naming
this rank, the peers, the step and the likely causes.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist


class TokenRingCommError(RuntimeError):
    """A TokenRing transfer or check failed or timed out (a peer died, raised, or hangs)."""


_LIKELY_CAUSES = (
    "likely causes: that rank raised or exited before this call (see its log), ranks called "
    "TokenRing with different inputs or a different number of times, ranks passed different "
    "groups, or it is slower than the group's timeout ({timeout:.0f} s)"
)


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


def group_timeout(group: dist.ProcessGroup) -> timedelta:
    """The timeout `group` was created with (our communicators inherit it)."""
    backend = dist.get_backend(group)
    device = torch.device("cuda" if backend == "nccl" else "cpu")
    try:
        return group._get_backend(device).options._timeout
    except (AttributeError, RuntimeError):
        return dist.distributed_c10d._get_default_timeout(backend)


@dataclass
class _RingComms:
    """What a ring needs besides its own group, looked up or made once per group."""

    out: dist.ProcessGroup  # returned partials
    check: dist.ProcessGroup  # the input check (CPU; the ring group itself on gloo)
    timeout: timedelta
    backend: str


# ring group -> its extra communicators; weak keys, so a destroyed group's entry cannot be found
# again by a new group that reuses its name
_COMMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _comms(group: dist.ProcessGroup) -> _RingComms:
    comms = _COMMS.get(group)
    if comms is None:
        ranks = _global_ranks(group)
        timeout = group_timeout(group)
        backend = dist.get_backend(group)
        try:
            # Members only, same order on each: never involves ranks outside this ring.
            out = dist.new_group(
                list(ranks), timeout=timeout, backend=backend, use_local_synchronization=True
            )
            check = group
            if backend != "gloo":
                check = dist.new_group(
                    list(ranks), timeout=timeout, backend="gloo", use_local_synchronization=True
                )
        except (RuntimeError, dist.DistError) as exc:
            raise TokenRingCommError(
                f"TokenRing could not create the return communicator of the ring of global "
                f"ranks {list(ranks)} on global rank {dist.get_rank()} within "
                f"{timeout.total_seconds():.0f} s ({str(exc).strip().splitlines()[0][:200]}); "
                "likely causes: a member of the ring raised or exited, did not call TokenRing "
                "(or setup_token_ring_group) with this group, or passed a different group"
            ) from exc
        comms = _COMMS[group] = _RingComms(out, check, timeout, backend)
    return comms


def setup_token_ring_group(group: dist.ProcessGroup | None) -> None:
    """Create the extra communicators of `group` now instead of at its first TokenRing call.

    Optional: a ring call creates them itself. Called by the ring's members only (a rank
    outside every ring does not call it); idempotent. group=None is the default group, as in
    `token_ring_attn` (nothing to set up without torch.distributed).
    """
    if group is None and dist.is_initialized():
        group = dist.group.WORLD
    if group is not None and dist.get_world_size(group) > 1:
        _comms(group)


def out_group_for(group: dist.ProcessGroup) -> dist.ProcessGroup:
    """The return communicator of `group` (made on first use by the ring's members)."""
    return _comms(group).out


def check_group_for(group: dist.ProcessGroup) -> dist.ProcessGroup:
    """Where the input check of `group` runs: the group itself on gloo, a CPU group else."""
    return _comms(group).check


def timeout_of(group: dist.ProcessGroup) -> timedelta:
    return _comms(group).timeout


def backend_of(group: dist.ProcessGroup) -> str:
    return _comms(group).backend


def lanes(pos: RingPosition) -> tuple[Lane, Lane]:
    """(Q lane on the ring group, return lane on its second communicator) for one ring call."""
    comms = _comms(pos.group)
    return Lane(pos.group, pos, comms), Lane(comms.out, pos, comms)


_GLOBAL_RANKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _global_ranks(group: dist.ProcessGroup) -> tuple[int, ...]:
    """Group rank -> global rank, looked up once per group (it is on every P2P op's path)."""
    ranks = _GLOBAL_RANKS.get(group)
    if ranks is None:
        ranks = _GLOBAL_RANKS[group] = tuple(dist.get_process_group_ranks(group))
    return ranks


def describe_peer(group: dist.ProcessGroup, rank: int) -> str:
    return f"ring rank {rank} (global rank {_global_ranks(group)[rank]})"


class Lane:
    """P2P transfers on one communicator: post a batch, wait for all of it later.

    Every wait is bounded by the ring's timeout; a failure becomes a TokenRingCommError that
    names the peers and the step of the batch. Per post only the facts are kept (the message is
    written if a transfer fails): this runs at every step of every ring call.
    """

    def __init__(self, group: dist.ProcessGroup, pos: RingPosition, comms: _RingComms):
        self.group = group
        self.pos = pos  # names this rank and the peers (ring ranks) in errors
        self._global = _global_ranks(group)
        # (work, (what, step, send peers, receive peers)) of every post not waited for yet
        self._works: list[tuple] = []
        self.step = 0
        # On gloo a wait blocks this thread: give the whole wait one deadline. On NCCL a wait
        # only orders the stream (the host must not block), and NCCL's watchdog bounds it.
        self._timeout_s = comms.timeout.total_seconds() if comms.backend == "gloo" else None

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
        about = (what, self.step, [p for _, p in sends], [p for _, p in recvs])
        try:
            works = dist.batch_isend_irecv(ops)
        except RuntimeError as exc:
            raise self._error(about, exc) from exc
        self._works.extend((w, about) for w in works)
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
            pending, self._works = self._works, []
        else:
            pending = [e for e in self._works if any(e[0] is w for w in works)]
            self._works = [e for e in self._works if all(e[0] is not w for w in works)]
        deadline = None if self._timeout_s is None else time.monotonic() + self._timeout_s
        for work, about in pending:
            try:
                if deadline is None:
                    work.wait()
                else:
                    work.wait(timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
            except RuntimeError as exc:
                raise self._error(about, exc) from exc

    def _error(self, about: tuple, exc: BaseException) -> TokenRingCommError:
        what, step, sends, recvs = about
        ring = self.pos.group
        parts = [f"send to {describe_peer(ring, p)}" for p in dict.fromkeys(sends)]
        parts += [f"receive from {describe_peer(ring, p)}" for p in dict.fromkeys(recvs)]
        return TokenRingCommError(
            f"TokenRing {what} transfer at step {step} ({', '.join(parts)}) failed on "
            f"{describe_peer(ring, self.pos.rank)}: {str(exc).strip().splitlines()[0][:300]}; "
            + _LIKELY_CAUSES.format(timeout=timeout_of(ring).total_seconds())
        )
