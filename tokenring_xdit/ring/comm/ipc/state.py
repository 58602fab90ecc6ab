"""One process's CUDA-IPC state per ring group (flag pages, inboxes, streams, health) and the
helpers the lanes share; `lanes.py` has the lane contract built on it (its docstring tells the
protocol)."""

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
from .protocol import LANES, READY, TAKEN, grown_capacity, page_bytes, word_offset

__all__ = ["IpcRing"]

_TAG = 0x7E10  # gloo tags of the inbox handshakes (plus the lane index)


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
    # inside a capture: the posted tensors, alive until the caller's stream has joined the
    # copies (record_stream cannot be used there; freed sooner, a later allocation of the same
    # capture reuses their memory, which a replay overwrites before the side stream copies it)
    keep: tuple = ()


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
