"""The lane contract the loops use, and its torch.distributed implementation.

A lane moves tensors between ring ranks on one communicator: `post` issues a step's sends and
receives, `wait` completes them (on gloo: the host blocks, bounded by the ring's deadline; on
NCCL: the stream waits and comm/watchdog.py bounds the call). Any other transport implements the
same three members. A failure marks the ring unusable and raises TokenRingCommError naming this
rank, the peers, the step and the lane.

A post runs at every step of every ring call, so its host cost bounds small or many-step calls.
It issues what `dist.batch_isend_irecv` would, straight on the lane's process group:
on NCCL one coalesced batch (start coalescing, each send and receive, end coalescing: one NCCL
group and one work, as torch's coalescing manager does), on gloo (no coalescing) one work per
op, as torch's own fallback does. Same C++ calls, same streams, under CUDA-graph capture too;
only torch's per-op Python (P2POp, the rank look-ups, the op list checks) is skipped, ~35 Python
calls an op. The peers' ranks in the lane's group are looked up once per group. Where the
process group lacks those methods (feature-detected at import), or for any other backend, the
lane calls `batch_isend_irecv` as before; `DIRECT_P2P = False` forces that (tests, benchmarks).
"""

from __future__ import annotations

import time
import weakref
from datetime import timedelta
from typing import NamedTuple, Protocol

import torch
import torch.distributed as dist

from .errors import COUNTERS, LIKELY_CAUSES, TokenRingCommError
from .groups import RingComms, describe_peer
from .step_marks import mark_captured_step
from .teardown import wait_for_aborts

__all__ = ["Lane", "TorchLane", "torch_lanes", "DIRECT_P2P"]

# What the direct issue calls on a process group (torch's own batch_isend_irecv calls the same)
_DIRECT_METHODS = ("send", "recv", "_start_coalescing", "_end_coalescing", "_get_backend")
# Issue on the process group directly where it can (see the module docstring); False: always
# through batch_isend_irecv. Read when a lane is made (once per ring call).
DIRECT_P2P: bool = all(hasattr(dist.ProcessGroup, m) for m in _DIRECT_METHODS)


class Lane(Protocol):
    step: int  # named in transfer errors

    def post(
        self,
        sends: list[tuple[torch.Tensor, int]],
        recvs: list[tuple[torch.Tensor, int]],
        what: str,
    ) -> list: ...

    def wait(self, works: list | None = None) -> None: ...


class TorchLane:
    """P2P transfers on one torch.distributed communicator: post a batch, wait for it later.

    Per post only the facts are kept (the message is written if a transfer fails): this runs
    at every step of every ring call.
    """

    def __init__(self, group: dist.ProcessGroup, rank: int, comms: RingComms, name: str):
        self.group = group
        self.rank = rank
        self.comms = comms
        self.name = name
        # (work, (what, step, send peers, receive peers)) of every post not waited for yet
        self._works: list[tuple] = []
        self.step = 0
        # On gloo a wait blocks this thread: give the whole wait one deadline. On NCCL a wait
        # only orders the stream (the host must not block): the watchdog bounds the call.
        gloo = comms.backend == "gloo"
        self._timeout_s = comms.deadline.total_seconds() if gloo else None
        # per-step marks for the deadline's error (eager NCCL calls; lanes are made inside the
        # call, so a capture is seen here once instead of at every wait)
        capturing = not gloo and torch.cuda.is_current_stream_capturing()
        self._mark = not gloo and not capturing
        self._mark_captured = not gloo and capturing  # replays name steps (step_marks.py)
        self._direct = _direct_of(group, comms) if DIRECT_P2P else None

    def post(
        self,
        sends: list[tuple[torch.Tensor, int]],
        recvs: list[tuple[torch.Tensor, int]],
        what: str,
    ) -> list:
        """Issue sends/recvs (tensor, ring rank) now; `wait` completes them.

        `what` is "q" or "partial" (a partial = its out and its lse: two messages), for counters.
        """
        if not sends and not recvs:
            return []
        about = (what, self.step, [p for _, p in sends], [p for _, p in recvs])
        direct = self._direct
        try:
            if direct is None:
                works = _batched(self.group, self.comms.ranks, sends, recvs)
            else:  # what batch_isend_irecv does for these tensors, without its per-op wrappers
                group, peers, device = self.group, direct.peers, direct.device
                if device is None:  # no coalescing (gloo): one work per op
                    works = [group.send([t], peers[p], 0) for t, p in sends]
                    works += [group.recv([t], peers[p], 0) for t, p in recvs]
                else:  # one coalesced batch (one NCCL group), one work
                    group._start_coalescing(device)
                    try:
                        for t, p in sends:
                            group.send([t], peers[p], 0)
                        for t, p in recvs:
                            group.recv([t], peers[p], 0)
                    except BaseException:
                        _close_batch(group, device)
                        raise
                    work = group._end_coalescing(device)
                    works = [] if work is None else [work]
        except RuntimeError as exc:
            raise self._error(about, exc) from exc
        pending = self._works
        for w in works:
            pending.append((w, about))
        if sends:
            counters = COUNTERS
            if what == "q":
                counters.q_messages += len(sends)
            else:
                counters.partial_messages += len(sends)
            by_peer = counters.by_peer
            for t, p in sends:
                counters.bytes_sent += t.nbytes
                by_peer[p] = by_peer.get(p, 0) + 1
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
        if self._mark and pending:
            # this step's NCCL work (already made; no extra CUDA call on the hot path): a step
            # whose work never completes is the one the deadline's error names (watchdog.py).
            # A capture's works belong to its first replay only: graphs record none.
            marks = self.comms.marks
            marks.append((pending[-1][0], (self.name,) + pending[-1][1]))
            if len(marks) > 256:  # a path that never reached watch(): keep the newest
                del marks[:128]
        elif self._mark_captured and pending:
            mark_captured_step(self.comms, self.name, pending[-1][1])

    def _error(self, about: tuple, exc: BaseException) -> TokenRingCommError:
        return transfer_error(self, about, exc, self.comms.deadline.total_seconds())


class _Direct(NamedTuple):
    """How a lane's group takes a post directly."""

    ranks: tuple[int, ...]  # the ring's global ranks these peers were computed for
    peers: tuple[int, ...]  # ring rank -> rank in the lane's group (what P2POp computes)
    device: torch.device | None  # coalesce on this device type; None: one work per op


# lane group -> its _Direct, or None where it must take batch_isend_irecv (weak: the ring's
# teardown destroys the group, the entry goes with it)
_DIRECT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _direct_of(group: dist.ProcessGroup, comms: RingComms) -> _Direct | None:
    """The direct issue of `group`'s posts, or None. What batch_isend_irecv would decide for
    the lane's tensors (CUDA on NCCL, CPU on gloo): coalesce where that backend supports it,
    one op at a time where it does not; other backends or group types keep the fallback."""
    if type(group) is not dist.ProcessGroup:  # a wrapper of torch's (or not weak-referable)
        return None
    direct = _DIRECT.get(group, False)
    if direct is False or (direct is not None and direct.ranks is not comms.ranks):
        direct = _DIRECT[group] = _decide(group, comms)
    return direct


def _decide(group: dist.ProcessGroup, comms: RingComms) -> _Direct | None:
    if comms.backend not in ("nccl", "gloo"):
        return None
    device = torch.device("cuda" if comms.backend == "nccl" else "cpu")
    try:
        coalesce = bool(getattr(group._get_backend(device), "supports_coalescing", False))
        peers = tuple(dist.get_group_rank(group, g) for g in comms.ranks)
    except (RuntimeError, ValueError):  # no such backend here, or a rank torch cannot map
        return None
    return _Direct(comms.ranks, peers, device if coalesce else None)


def _close_batch(group: dist.ProcessGroup, device: torch.device) -> None:
    """End a batch an op of which raised. NCCL's coalescing opened an NCCL group on this thread
    (ncclGroupStart): left open, every later NCCL call of the thread, on any communicator,
    would join it and never run. torch's coalescing manager leaves it open; the ring is failed
    either way (what was queued is issued and bounded by the ring's deadline)."""
    try:
        group._end_coalescing(device)
    except RuntimeError:
        pass


def _batched(group: dist.ProcessGroup, ranks: tuple[int, ...], sends, recvs) -> list:
    """The fallback: torch's batch_isend_irecv (peers as global ranks)."""
    ops = [dist.P2POp(dist.isend, t, ranks[p], group) for t, p in sends]
    ops += [dist.P2POp(dist.irecv, t, ranks[p], group) for t, p in recvs]
    return dist.batch_isend_irecv(ops)


def transfer_error(
    lane, about: tuple, exc: BaseException, timeout_s: float, via: str = ""
) -> TokenRingCommError:
    """The error of a lane's failed transfer (about: what, step, send peers, receive peers),
    naming ranks, step and lane; marks the ring unusable. `lane`: a TorchLane or IpcLane."""
    what, step, sends, recvs = about
    comms = lane.comms
    parts = [f"send to {describe_peer(comms, p)}" for p in dict.fromkeys(sends)]
    parts += [f"receive from {describe_peer(comms, p)}" for p in dict.fromkeys(recvs)]
    message = (
        f"TokenRing {what} transfer at step {step} on the {lane.name} lane "
        f"({via}{', '.join(parts)}) failed on {describe_peer(comms, lane.rank)}: "
        f"{str(exc).strip().splitlines()[0][:300]}; " + LIKELY_CAUSES.format(timeout=timeout_s)
    )
    comms.fail(message)
    wait_for_aborts(timeout_s)  # the deadline's abort of this ring (if any) ends first
    return TokenRingCommError(message)


def torch_lanes(comms: RingComms, rank: int) -> tuple[TorchLane, TorchLane]:
    """(Q lane, return lane) of one ring call."""
    return TorchLane(comms.q, rank, comms, "Q"), TorchLane(comms.out, rank, comms, "return")
