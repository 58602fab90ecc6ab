"""TokenRing's lanes over CUDA IPC: copies into the peer's receive buffer, ordered by flag words.

A second implementation of the lane contract (`post(sends, recvs, what)` -> handles,
`wait(handles=None)`, `step` named in errors) for ranks that share a GPU (where NCCL refuses to
run) or whose GPUs can access each other. Per ring (its RingComms) and process: one flag page and,
per lane and sending peer, one receive buffer ("inbox"), allocated on first use and grown when a
message does not fit; the IPC handles travel once over the ring's CPU (gloo) group. A post
enqueues, per peer, on the lane's send stream: wait until the peer's inbox is free, copy the
pieces into it (cuMemcpyAsync), flag it READY in the peer's page; and on the lane's receive
stream: wait for READY, copy the pieces out into the caller's tensors, flag the inbox free again
in the sender's page (`protocol.py` has the words; docs/how-it-works.md the per-step sketch).
No SM runs any of it. `wait` orders the caller's stream after the copies and blocks the host
until they are done, at most the ring's deadline: a dead or hung peer becomes
`TokenRingCommError` naming ranks, step and lane, after which our streams are released and the
ring is marked unusable. Inside a CUDA-graph capture the same stream operations are recorded
(the flag values never change, so replays repeat them) and the host wait moves to the end of
the call (`ipc_finished`).
"""

from __future__ import annotations

import struct
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import COUNTERS, LIKELY_CAUSES, TokenRingCommError
from ..groups import RingComms, describe_peer
from . import driver as drv
from .protocol import LANES, READY, TAKEN, grown_capacity, pack, page_bytes, word_offset

__all__ = ["IpcLane", "IpcRing", "ipc_finished", "ipc_lanes"]

LANE_NAMES = ("Q", "return")
_TAG = 0x7E10  # gloo tags of the inbox handshakes (plus the lane index)


def ipc_lanes(comms: RingComms, rank: int) -> tuple[IpcLane, IpcLane]:
    """(Q lane, return lane) over CUDA IPC for one ring call; the ring's buffers and flags are
    set up by its members' first call (collectively, on the ring's CPU group)."""
    ring = _RINGS.get(comms)
    if ring is None:
        device = torch.cuda.current_device() if torch.cuda.is_available() else -1
        ring = _RINGS[comms] = IpcRing(comms, rank, device)
    ring.check_usable()
    return IpcLane(ring, 0), IpcLane(ring, 1)


_RINGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _poll(event: torch.cuda.Event, deadline: float) -> bool:
    """Wait for `event` until `deadline` (monotonic); back off from spinning to 1 ms sleeps."""
    pause = 0.0
    while not event.query():
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(1e-3, pause * 2 or 1e-6)
    return True


@dataclass
class _Work:
    event: torch.cuda.Event
    about: tuple  # (what, step, send peers, receive peers), for the error message


class IpcRing:
    """One process's IPC state for one ring group: flag pages, inboxes, streams."""

    def __init__(self, comms: RingComms, rank: int, device: int):
        self.comms, self.rank, self.size, self.device = comms, rank, len(comms.ranks), device
        self.cpu = comms.check
        self.timeout_s = comms.deadline.total_seconds()
        self.global_ranks = comms.ranks
        self.broken: str | None = None
        self.page, self.pages = self._open_pages()
        self.inbox: dict[tuple[int, int], drv.DeviceMemory] = {}  # (lane, sender) -> ours
        self.outbox: dict[tuple[int, int], tuple[int, int]] = {}  # (lane, receiver) -> ptr, cap
        self.retired: list[drv.DeviceMemory] = []  # outgrown inboxes (a late copy may land)
        self.mapped: list[int] = [p for r, p in enumerate(self.pages) if r != self.rank]
        self.send_streams = [torch.cuda.Stream(device) for _ in range(LANES)]
        self.recv_streams = [torch.cuda.Stream(device) for _ in range(LANES)]
        self.outstanding: list[torch.cuda.Event] = []
        self._health = _Health()
        fin = weakref.finalize(
            self, _free, self._health, self.page, self.inbox, self.retired, self.mapped, device
        )
        fin.atexit = False  # at exit the driver frees everything, and may be gone already

    # --- setup -------------------------------------------------------------------------------

    def _open_pages(self) -> tuple[drv.DeviceMemory, list[int]]:
        """Our flag page and every rank's, mapped here. Collective on the CPU group: a rank that
        cannot run the transport makes every rank raise the same error."""
        page, problem, handle, uuid = None, None, None, None
        try:
            page = drv.DeviceMemory.alloc(page_bytes(self.size), self.device)  # zeros: all free
            handle = page.handle()
            uuid = str(torch.cuda.get_device_properties(self.device).uuid)
        except (RuntimeError, AssertionError) as exc:  # no cuda-bindings, no CUDA, no driver
            problem = str(exc).strip().splitlines()[0][:300]
        everyone: list = [None] * self.size
        try:
            dist.all_gather_object(everyone, (handle, uuid, problem), group=self.cpu)
        except RuntimeError as exc:
            if page is not None:
                page.free()
            raise TokenRingCommError(
                f"TokenRing could not set up the IPC transport on "
                f"{describe_peer(self.comms, self.rank)}: a ring rank did not take part "
                f"({str(exc).strip().splitlines()[0][:200]}); "
                + LIKELY_CAUSES.format(timeout=self.timeout_s)
            ) from exc
        if not any(p for _, _, p in everyone):
            problem = self._peer_problem([u for _, u, _ in everyone])
            problems: list = [None] * self.size
            dist.all_gather_object(problems, problem, group=self.cpu)
            everyone = [(h, u, p) for (h, u, _), p in zip(everyone, problems, strict=True)]
        if any(p for _, _, p in everyone):
            if page is not None:
                page.free()
            lines = [f"ring rank {r}: {p}" for r, (_, _, p) in enumerate(everyone) if p]
            raise ValueError(
                "The ipc transport (TOKENRING_XDIT_TRANSPORT) needs CUDA, the cuda-bindings "
                "package, and every ring rank's GPU to be this GPU or a peer it can access "
                "(torch.cuda.can_device_access_peer); use TOKENRING_XDIT_TRANSPORT=nccl for "
                "this ring:\n  " + "\n  ".join(lines)
            )
        pages = [
            page.ptr if r == self.rank else drv.open_peer(h, self.device)
            for r, (h, _, _) in enumerate(everyone)
        ]
        return page, pages

    def _peer_problem(self, uuids: list[str]) -> str | None:
        local = {
            str(torch.cuda.get_device_properties(i).uuid): i
            for i in range(torch.cuda.device_count())
        }
        bad = []
        for r, uuid in enumerate(uuids):
            j = local.get(uuid)
            if j is None:
                bad.append(f"GPU {uuid} of ring rank {r} is not visible here")
            elif j != self.device and not torch.cuda.can_device_access_peer(self.device, j):
                bad.append(f"cuda:{self.device} cannot access cuda:{j} of ring rank {r}")
        return "; ".join(bad) or None

    def ensure_capacity(
        self, lane: int, send_bytes: dict[int, int], recv_bytes: dict[int, int], deadline: float
    ) -> None:
        """Grow inboxes that a message will not fit, and learn the peers' grown ones.

        Both ends decide from the same message size and the same capacity history, so a new
        handle is sent exactly when the other end expects one. Sends (ours) go out before any
        receive is waited for, so a ring of handshakes cannot deadlock.
        """
        works = []
        for peer, need in recv_bytes.items():
            old = self.inbox.get((lane, peer))
            cap = grown_capacity(need, old.nbytes if old else 0)
            if cap:
                mem = drv.DeviceMemory.alloc(cap, self.device, zero=False)
                if old is not None:
                    self.retired.append(old)
                self.inbox[(lane, peer)] = mem
                msg = torch.tensor([cap, *struct.unpack("<8q", mem.handle())], dtype=torch.int64)
                dst = self.global_ranks[peer]
                works.append((dist.isend(msg, dst=dst, group=self.cpu, tag=_TAG + lane), msg))
        answers = []
        for peer, need in send_bytes.items():
            _, cap = self.outbox.get((lane, peer), (0, 0))
            if grown_capacity(need, cap):
                buf = torch.empty(9, dtype=torch.int64)
                src = self.global_ranks[peer]
                work = dist.irecv(buf, src=src, group=self.cpu, tag=_TAG + lane)
                works.append((work, buf))
                answers.append((peer, buf))
        for work, _ in works:
            left = max(deadline - time.monotonic(), 0.001)
            if not work.wait(timeout=_seconds(left)):
                raise TimeoutError(f"no inbox handshake within {self.timeout_s:.0f} s")
        for peer, buf in answers:
            cap, *words = buf.tolist()
            ptr = drv.open_peer(struct.pack("<8q", *words), self.device)
            self.mapped.append(ptr)  # an outgrown mapping stays until the ring goes
            self.outbox[(lane, peer)] = (ptr, cap)

    def needs_growth(
        self, lane: int, send_bytes: dict[int, int], recv_bytes: dict[int, int]
    ) -> bool:
        inbox = [(n, self.inbox.get((lane, p))) for p, n in recv_bytes.items()]
        outbox = [(n, self.outbox.get((lane, p), (0, 0))[1]) for p, n in send_bytes.items()]
        return any(grown_capacity(n, m.nbytes if m else 0) for n, m in inbox) or any(
            grown_capacity(n, cap) for n, cap in outbox
        )

    # --- flags and failure --------------------------------------------------------------------

    def word(self, owner: int, lane: int, peer: int, kind: int) -> int:
        """Address (here) of the (lane, peer, kind) flag word in `owner`'s page."""
        return self.pages[owner] + word_offset(lane, peer, kind, self.size)

    def check_usable(self) -> None:
        self.comms.ensure_usable()  # the ring's mark (any failure of this ring sets it)
        if self.broken:
            raise TokenRingCommError(
                f"TokenRing: an earlier IPC transfer of this ring failed on "
                f"{describe_peer(self.comms, self.rank)} ({self.broken}); its buffers are in an "
                "unknown state: create a new process group for the ring"
            )

    def fail(self, why: str) -> None:
        """Mark the ring unusable and release our streams from flags no peer will write, so
        that nothing queued behind them (a device synchronize) hangs the process."""
        self.broken = self._health.broken = why
        self.comms.fail(why)
        stream = torch.cuda.Stream(self.device)
        end = time.monotonic() + 2.0
        while any(not e.query() for e in self.outstanding) and time.monotonic() < end:
            for lane in range(LANES):
                for peer in range(self.size):
                    drv.write_value(stream, self.word(self.rank, lane, peer, READY), 1)
                    drv.write_value(stream, self.word(self.rank, lane, peer, TAKEN), 0)
            stream.synchronize()
            time.sleep(1e-3)
        self.outstanding.clear()


def ipc_finished(comms: RingComms, what: str) -> None:
    """At the end of a ring call over IPC: wait on the host, at most the ring's deadline, until
    the call's GPU work so far is done. Eager calls have waited at every step already; for a
    CUDA-graph replay this is the only wait. A peer that never answered: TokenRingCommError,
    our streams released, the ring unusable. No-op inside a capture."""
    ring = _RINGS.get(comms)
    if ring is None or torch.cuda.is_current_stream_capturing():
        return
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(ring.device))
    if not _poll(event, time.monotonic() + ring.timeout_s):
        ring.outstanding.append(event)
        message = (
            f"TokenRing {what} over ipc did not finish within {ring.timeout_s:.0f} s on "
            f"{describe_peer(comms, ring.rank)}; " + LIKELY_CAUSES.format(timeout=ring.timeout_s)
        )
        ring.fail(message)
        raise TokenRingCommError(message)


def _seconds(s: float):
    from datetime import timedelta

    return timedelta(seconds=s)


@dataclass
class _Health:
    broken: str | None = None


def _free(health: _Health, page, inbox, retired, mapped, device) -> None:
    """Finalizer of an IpcRing (its group is gone): unmap the peers' memory, free ours. A
    broken ring keeps it (a stream may still wait on it; freeing would synchronize)."""
    if health.broken:
        return
    try:
        torch.cuda.synchronize(device)
        for ptr in mapped:
            drv.close_peer(ptr, device)
        for mem in [page, *inbox.values(), *retired]:
            mem.free()
    except Exception:  # interpreter or driver shutting down: the process exit frees it all
        pass


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
        ring, lane = self.ring, self.index
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
        send_bytes = {p: pack([_nbytes(t) for t in ts])[1] for p, ts in out.items()}
        recv_bytes = {p: pack([_nbytes(t) for t in ts])[1] for p, ts in into.items()}
        if capturing:
            if ring.needs_growth(lane, send_bytes, recv_bytes):
                raise RuntimeError(
                    "TokenRing ipc: a message does not fit its buffer inside a CUDA-graph "
                    "capture (the eager call before a capture grows the buffers)"
                )
        else:
            deadline = time.monotonic() + ring.timeout_s
            try:
                ring.ensure_capacity(lane, send_bytes, recv_bytes, deadline)
            except (RuntimeError, TimeoutError) as exc:
                error = self._error(about, exc)
                ring.fail(str(error))
                raise error from exc
        current = torch.cuda.current_stream(ring.device)
        works = []
        if out:
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
                    if not capturing:  # a capture's pool keeps its tensors
                        t.record_stream(stream)
                drv.write_value(stream, ring.word(peer, lane, ring.rank, READY), 1)
            works.append(self._record(stream, about, capturing))
        if into:
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
            works.append(self._record(stream, about, capturing))
        self._works.extend(works)
        _count(what, sends)
        return works

    def _record(self, stream: torch.cuda.Stream, about: tuple, capturing: bool) -> _Work:
        event = torch.cuda.Event()
        event.record(stream)
        if not capturing:
            self.ring.outstanding.append(event)
        return _Work(event, about)

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
        what, step, sends, recvs = about
        comms = self.comms
        parts = [f"send to {describe_peer(comms, p)}" for p in dict.fromkeys(sends)]
        parts += [f"receive from {describe_peer(comms, p)}" for p in dict.fromkeys(recvs)]
        message = (
            f"TokenRing {what} transfer at step {step} on the {self.name} lane "
            f"(ipc; {', '.join(parts)}) failed on {describe_peer(comms, self.rank)}: "
            f"{str(exc).strip().splitlines()[0][:300]}; "
            + LIKELY_CAUSES.format(timeout=self.ring.timeout_s)
        )
        self.comms.fail(message)
        return TokenRingCommError(message)


def _by_peer(pairs: list[tuple[torch.Tensor, int]]) -> OrderedDict:
    grouped: OrderedDict = OrderedDict()
    for t, p in pairs:
        grouped.setdefault(p, []).append(t)
    return grouped


def _count(what: str, sends: list[tuple[torch.Tensor, int]]) -> None:
    """The same counters as the torch.distributed lanes (tests compare the schedules)."""
    if what == "q":
        COUNTERS.q_messages += len(sends)
    else:
        COUNTERS.partial_messages += len(sends)
    for t, p in sends:
        COUNTERS.bytes_sent += _nbytes(t)
        COUNTERS.by_peer[p] = COUNTERS.by_peer.get(p, 0) + 1
