"""TokenRing's lanes over CUDA IPC: copies into the peer's receive buffer, ordered by flag words.

A second implementation of the lane contract (`post(sends, recvs, what)` -> handles,
`wait(handles=None)`, `step` named in errors) for ranks that share a GPU (where NCCL refuses to
run) or whose GPUs can access each other. Per ring (its RingComms) and process: one flag page and,
per lane and sending peer, one receive buffer ("inbox"), allocated on first use and grown when a
message does not fit; the IPC handles travel once over the ring's CPU (gloo) group. A post
enqueues, per peer, on the lane's send stream: wait until the peer's inbox is free, copy the
pieces into it (cuMemcpyAsync), flag it READY in the peer's page; and on the lane's receive
stream: wait for READY, copy the pieces out into the caller's tensors, flag the inbox free again
in the sender's page (`protocol.py` has the words, `state.py` the per-ring state;
docs/how-it-works.md the per-step sketch).
No SM runs any of it. `wait` orders the caller's stream after the copies and blocks the host
until they are done, at most the ring's deadline: a dead or hung peer becomes
`TokenRingCommError` naming ranks, step and lane, after which our streams are released and the
ring is marked unusable. Inside a CUDA-graph capture the same stream operations are recorded
(the flag values never change, so replays repeat them) and the host wait moves to the end of
the call (`ipc_finished`).
"""

from __future__ import annotations

import time

import torch

from ..errors import LIKELY_CAUSES, TokenRingCommError
from ..groups import RingComms, describe_peer
from ..lanes import transfer_error
from ..step_marks import mark_captured_step, stalled_step
from . import driver as drv
from .protocol import READY, TAKEN, pack
from .state import _RINGS, IpcRing, _by_peer, _count, _nbytes, _poll, _Work

__all__ = ["IpcLane", "IpcRing", "ipc_finished", "ipc_lanes"]

LANE_NAMES = ("Q", "return")


def ipc_lanes(comms: RingComms, rank: int) -> tuple[IpcLane, IpcLane]:
    """(Q lane, return lane) over CUDA IPC for one ring call; the ring's buffers and flags are
    set up by its members' first call (collectively, on the ring's CPU group)."""
    ring = _RINGS.get(comms)
    if ring is None:
        device = torch.cuda.current_device() if torch.cuda.is_available() else -1
        ring = _RINGS[comms] = IpcRing(comms, rank, device)
    ring.check_usable()
    return IpcLane(ring, 0), IpcLane(ring, 1)


def ipc_finished(comms: RingComms, what: str) -> None:
    """At the end of a ring call over IPC: wait on the host, at most the ring's deadline, until
    the call's GPU work so far is done. Eager calls have waited at every step already; for a
    CUDA-graph replay this is the only wait. A peer that never answered: TokenRingCommError,
    our streams released, the ring unusable. No-op inside a capture."""
    ring = _RINGS.get(comms)
    if ring is None or torch.cuda.is_current_stream_capturing():
        return
    marks, comms.marks = comms.marks, []  # a replay's captured steps (step_marks.py)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(ring.device))
    if not _poll(event, time.monotonic() + ring.timeout_s):
        ring.outstanding.append(event)
        message = (
            f"TokenRing {what} over ipc did not finish within {ring.timeout_s:.0f} s on "
            f"{describe_peer(comms, ring.rank)}{stalled_step(comms, marks)}; "
            + LIKELY_CAUSES.format(timeout=ring.timeout_s)
        )
        ring.fail(message)
        raise TokenRingCommError(message)


class IpcLane:
    """One lane of an IpcRing (0: Q lane, 1: return lane); see the module docstring."""

    def __init__(self, ring: IpcRing, index: int):
        self.ring, self.index = ring, index
        self.comms, self.rank = ring.comms, ring.rank
        self.name = LANE_NAMES[index]
        self.step = 0
        self._works: list[_Work] = []

    def post(
        self,
        sends: list[tuple[torch.Tensor, int]],
        recvs: list[tuple[torch.Tensor, int]],
        what: str,
    ) -> list[_Work]:
        """Enqueue the copies of sends/recvs (tensor, ring rank); `wait` completes them."""
        if not sends and not recvs:
            return []
        ring = self.ring
        about = (what, self.step, [p for _, p in sends], [p for _, p in recvs])
        ring.check_usable()
        # Inside a CUDA-graph capture the stream operations are recorded, not run: the buffers
        # must exist already (the eager warm-up of this signature made them) and the host waits
        # move to the end of each replay (`check_replay`).
        capturing = torch.cuda.is_current_stream_capturing()
        sends = [(t if t.is_contiguous() else t.contiguous(), p) for t, p in sends]
        for t, _ in recvs:
            if not t.is_contiguous() or t.device.index != ring.device:
                raise RuntimeError("an IPC receive needs a dense tensor on the ring's GPU")
        out, into = _by_peer(sends), _by_peer(recvs)
        self._make_room(out, into, about, capturing)
        current = torch.cuda.current_stream(ring.device)
        works = []
        if out:
            works.append(self._send(out, current, about, capturing))
        if into:
            works.append(self._receive(into, current, about, capturing))
        self._works.extend(works)
        _count(what, sends)
        return works

    def _make_room(self, out: dict, into: dict, about: tuple, capturing: bool) -> None:
        """Grow the buffers this post's messages need (never inside a capture: there they must
        fit already)."""
        ring, lane = self.ring, self.index
        send_bytes = {p: pack([_nbytes(t) for t in ts])[1] for p, ts in out.items()}
        recv_bytes = {p: pack([_nbytes(t) for t in ts])[1] for p, ts in into.items()}
        if capturing:
            if ring.needs_growth(lane, send_bytes, recv_bytes):
                raise RuntimeError(
                    "TokenRing ipc: a message does not fit its buffer inside a CUDA-graph "
                    "capture (the eager call before a capture grows the buffers)"
                )
            return
        deadline = time.monotonic() + ring.timeout_s
        try:
            ring.ensure_capacity(lane, send_bytes, recv_bytes, deadline)
        except (RuntimeError, TimeoutError) as exc:
            error = self._error(about, exc)
            ring.fail(str(error))
            raise error from exc

    def _send(self, out: dict, current, about: tuple, capturing: bool) -> _Work:
        """On the send stream, per peer: wait for its inbox, copy in, flag it READY."""
        ring, lane = self.ring, self.index
        stream = ring.send_streams[lane]
        stream.wait_stream(current)  # the payload is produced on the caller's stream
        for peer, ts in out.items():
            offsets, _ = pack([_nbytes(t) for t in ts])
            taken = ring.word(ring.rank, lane, peer, TAKEN)
            drv.wait_value(stream, taken, 0)  # the peer has copied our last message out
            drv.write_value(stream, taken, 1)
            base = ring.outbox[(lane, peer)][0]
            for t, off in zip(ts, offsets, strict=True):
                drv.memcpy(stream, base + off, t.data_ptr(), _nbytes(t))
                if not capturing:  # in a capture the work keeps them (_Work.keep)
                    t.record_stream(stream)
            drv.write_value(stream, ring.word(peer, lane, ring.rank, READY), 1)
        return self._record(stream, about, capturing, out)

    def _receive(self, into: dict, current, about: tuple, capturing: bool) -> _Work:
        """On the receive stream, per peer: wait for READY, copy out, free the inbox."""
        ring, lane = self.ring, self.index
        stream = ring.recv_streams[lane]
        stream.wait_stream(current)  # fresh receive tensors may reuse memory in use there
        for peer, ts in into.items():
            offsets, _ = pack([_nbytes(t) for t in ts])
            ready = ring.word(ring.rank, lane, peer, READY)
            drv.wait_value(stream, ready, 1)
            drv.write_value(stream, ready, 0)
            base = ring.inbox[(lane, peer)].ptr
            for t, off in zip(ts, offsets, strict=True):
                drv.memcpy(stream, t.data_ptr(), base + off, _nbytes(t))
                if not capturing:
                    t.record_stream(stream)
            drv.write_value(stream, ring.word(peer, lane, ring.rank, TAKEN), 0)
        return self._record(stream, about, capturing, into)

    def _record(
        self, stream: torch.cuda.Stream, about: tuple, capturing: bool, tensors: dict
    ) -> _Work:
        event = torch.cuda.Event()
        event.record(stream)
        if not capturing:
            self.ring.outstanding.append(event)
            return _Work(event, about)
        return _Work(event, about, tuple(t for ts in tensors.values() for t in ts))

    def wait(self, works: list | None = None) -> None:
        """Wait for `works` (one post's handles), or for everything posted on this lane."""
        if works is None:
            pending, self._works = self._works, []
        else:
            pending = [w for w in self._works if any(w is x for x in works)]
            self._works = [w for w in self._works if all(w is not x for x in works)]
        ring = self.ring
        deadline = time.monotonic() + ring.timeout_s
        current = torch.cuda.current_stream(ring.device)
        if torch.cuda.is_current_stream_capturing():  # joins the capture; checked per replay
            for work in pending:
                current.wait_event(work.event)
            if pending:  # a stuck replay names this step (step_marks.py)
                mark_captured_step(self.comms, self.name, pending[-1].about)
            return
        for work in pending:
            if not _poll(work.event, deadline):
                error = self._error(
                    work.about, TimeoutError(f"not done within {ring.timeout_s:.0f} s")
                )
                ring.fail(str(error))
                raise error
            current.wait_event(work.event)
            ring.outstanding = [e for e in ring.outstanding if e is not work.event]

    def _error(self, about: tuple, exc: BaseException) -> TokenRingCommError:
        return transfer_error(self, about, exc, self.ring.timeout_s, via="ipc; ")
