"""A deadline for NCCL rings that never blocks the host.

On NCCL a lane's wait only orders the GPU stream; a peer that died or went elsewhere leaves the
ring's kernels waiting forever, and torch's own watchdog would abort the process at the
communicator's timeout. Instead each finished NCCL call records one CUDA event (reused from
finished calls; also after CUDA-graph replays), and a daemon thread polls the oldest: one that is
not done by the ring's deadline aborts the ring's own communicators (the stuck transfers then
end, so the GPU moves on), marks the ring unusable, and logs the named error; the next TokenRing
call on that ring raises it as TokenRingCommError. Our communicators' NCCL timeout is twice the
deadline (comm/groups.py), so this fires first.

The polling thread runs in the thread-local stream-capture mode, as torch's own NCCL watchdog
does (pytorch#148594): in CUDA's default (global) mode an event query from another thread during
a capture can invalidate that capture. (Not reproduced on CUDA 13 / H200: a pending
event polled all through a capture left it intact either way; kept as torch keeps it.)
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections import deque

import torch
import torch.distributed as dist

from .errors import LIKELY_CAUSES
from .groups import RingComms
from .step_marks import stalled_step
from .teardown import abort_together, release_graphs

__all__ = ["watch"]

log = logging.getLogger("tokenring_xdit")
_POLL_S = 0.002
_items: deque = deque()  # (event, device, deadline, comms, what), oldest first
# Items the watchdog is done with. Their events are dropped by the next watch(), in the
# calling thread, never in the watchdog's: cudaEventDestroy waits for a driver lock, and a graph
# launch blocked behind a stuck replay (most likely for room in the launch queue) held it, so a
# watchdog destroying an event there waited for the replay to end, which needed the watchdog's
# abort (measured, 4 x H200, native stacks: main thread in cuGraphLaunch, watchdog in
# cuEventDestroy; the survivor never raised). Its event queries did not wait there.
_spent: list = []
# device -> events of finished calls, recorded again by the next watch() on that device: in
# steady state no call creates or destroys an event (each did both, a few microseconds of
# host time per ring call).
_reuse: dict[int, list] = {}
_REUSE_MAX = 64  # per device; more in flight at once is rare (events beyond it are dropped)
_cv = threading.Condition()
_thread: list[threading.Thread] = []


def watch(comms: RingComms, what: str) -> None:
    """Bound the NCCL work this call queued (everything on the current stream so far)."""
    device = torch.cuda.current_device()
    with _cv:
        _recycle()
        free = _reuse.get(device)
        event = free.pop() if free else torch.cuda.Event()
    event.record()
    marks, comms.marks = comms.marks, []
    with _cv:
        _items.append(
            (event, device, time.monotonic() + comms.deadline.total_seconds(), comms,
             (what, marks))
        )  # fmt: skip
        if not _thread:
            _thread.append(threading.Thread(target=_run, name="tokenring-watchdog", daemon=True))
            _thread[0].start()
        _cv.notify()


def _recycle() -> None:
    """Under the lock, in the calling thread: the watchdog's finished items give their events
    back for reuse; an expired call's event (its work may never finish) is dropped."""
    for event, device, _, _, _, done in _spent:
        free = _reuse.setdefault(device, [])
        if done and len(free) < _REUSE_MAX:
            free.append(event)
    _spent.clear()


# CUstreamCaptureMode: CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
_THREAD_LOCAL = 1


def thread_local_capture_mode() -> bool:
    """Put the calling thread in the thread-local capture mode (CUDA driver API, which every
    CUDA machine has; no context is made). False where the driver cannot be reached."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
        mode = ctypes.c_int(_THREAD_LOCAL)
        return driver.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode)) == 0
    except (OSError, AttributeError):
        return False


def _run() -> None:
    if not thread_local_capture_mode():
        log.debug("TokenRing watchdog: could not set the thread-local capture mode")
    while True:
        with _cv:
            while not _items:
                _cv.wait()
            event, _, deadline, comms, what = _items[0]
        done = event.query()
        expired = not done and time.monotonic() > deadline
        if expired:
            _expire(comms, what)
        with _cv:  # this thread's references go first, under the lock (see _spent)
            del event, what
            if done:
                _spent.append((*_items.popleft(), True))
            elif expired:
                _spent.extend((*i, False) for i in _items if i[3] is comms)
                kept = [i for i in _items if i[3] is not comms]
                _items.clear()
                _items.extend(kept)
                del kept
        if not (done or expired):
            time.sleep(_POLL_S)


def _expire(comms: RingComms, call: tuple[str, list]) -> None:
    what, marks = call
    message = (
        f"TokenRing {what} on the ring of global ranks {list(comms.ranks)} did not finish within "
        f"its deadline of {comms.deadline.total_seconds():.0f} s on global rank "
        f"{dist.get_rank() if dist.is_initialized() else 0}{stalled_step(comms, marks)}; "
        + LIKELY_CAUSES.format(timeout=comms.deadline.total_seconds())
    )
    comms.fail(message)
    log.error("%s", message)
    # Frees the GPU from the stuck transfers: both lanes at once (teardown.abort_together says
    # why). Measured (2 x H200, deadline 8 s): eager training and eager inference
    # then raise in the calling thread about 8.1 s after the peer died.
    # NCCL's abort raises its flag (the stuck kernels quit), then waits until every CUDA graph
    # that captured the communicator is destroyed (commDestroySync polls its persistent
    # references): so once the aborts are under way, drop our graphs, or a stuck replay's abort
    # never ends (measured: replays never raised). Not before: destroying a graph still in
    # flight may wait for it. The graphs of other rings are captured again on their next call.
    lanes = [g for g in comms.owned() if g is not comms.check]
    stuck = abort_together(lanes, comms.deadline.total_seconds(), started=release_graphs)
    if stuck:
        log.error("TokenRing: the abort of %d ring communicator(s) did not finish", len(stuck))
