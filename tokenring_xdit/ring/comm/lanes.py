"""The lane contract the loops use, and its torch.distributed implementation.

A lane moves tensors between ring ranks on one communicator: `post` issues a step's sends and
receives, `wait` completes them (on gloo: the host blocks, bounded by the ring's deadline; on
NCCL: the stream waits and comm/watchdog.py bounds the call). Any other transport implements the
same three members. A failure marks the ring unusable and raises TokenRingCommError naming this
rank, the peers, the step and the lane.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist

from .errors import COUNTERS, LIKELY_CAUSES, TokenRingCommError
from .groups import RingComms, describe_peer
from .step_marks import mark_captured_step
from .teardown import wait_for_aborts

__all__ = ["Lane", "TorchLane", "torch_lanes"]


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

    def post(
        self,
        sends: list[tuple[torch.Tensor, int]],
        recvs: list[tuple[torch.Tensor, int]],
        what: str,
    ) -> list:
        """Issue sends/recvs (tensor, ring rank) now; `wait` completes them.

        `what` is "q" or "partial" (a partial = its out and its lse: two messages), for counters.
        """
        ranks, group = self.comms.ranks, self.group
        ops = [dist.P2POp(dist.isend, t, ranks[p], group) for t, p in sends]
        ops += [dist.P2POp(dist.irecv, t, ranks[p], group) for t, p in recvs]
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
