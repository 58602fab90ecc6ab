"""The deadline's watchdog never destroys a CUDA event in its own thread (issue 44): on 4 x H200
a survivor whose replay was stuck never raised because the watchdog sat in cuEventDestroy,
waiting for a driver lock while the main thread's cuGraphLaunch was blocked behind the stuck
replay. Events are released by the calling thread's next watch().
Runs the real watchdog thread with stand-in events (no GPU here) that record where they die."""

from __future__ import annotations

import gc
import threading
import time
from datetime import timedelta

from tokenring_xdit.ring.comm import watchdog

DIED_IN: list[str] = []


class _Event:
    """Stands in for torch.cuda.Event: done at once, or never (`stuck`)."""

    stuck = False

    def record(self) -> None:
        pass

    def query(self) -> bool:
        return not self.stuck

    def __del__(self) -> None:
        DIED_IN.append(threading.current_thread().name)


class _Comms:
    def __init__(self, seconds: float):
        self.marks: list = []
        self.deadline = timedelta(seconds=seconds)


def _wait_until(cond, seconds: float = 10.0) -> None:
    end = time.monotonic() + seconds
    while not cond() and time.monotonic() < end:
        time.sleep(0.01)
    assert cond()


def test_events_die_in_the_calling_thread_done_or_expired(monkeypatch):
    monkeypatch.setattr(watchdog.torch.cuda, "Event", _Event)
    expired = []
    monkeypatch.setattr(watchdog, "_expire", lambda comms, what: expired.append(what[0]))
    DIED_IN.clear()
    comms = _Comms(60.0)
    for i in range(5):  # finished calls: each is popped by the watchdog, freed by the next watch
        watchdog.watch(comms, f"call {i}")
        _wait_until(lambda: not watchdog._items)
    gc.collect()
    assert DIED_IN == ["MainThread"] * 4  # the last one waits in _spent for the next call

    # a stuck call past its deadline, with a later call of the same ring queued behind it
    monkeypatch.setattr(_Event, "stuck", True)
    stuck = _Comms(0.05)
    watchdog.watch(stuck, "stuck call")
    watchdog.watch(stuck, "queued call")
    _wait_until(lambda: expired == ["stuck call"] and not watchdog._items)
    time.sleep(0.05)
    gc.collect()
    assert set(DIED_IN) == {"MainThread"}  # nothing died in the watchdog's thread
    monkeypatch.setattr(_Event, "stuck", False)
    watchdog.watch(comms, "after")  # frees what the watchdog set aside, here
    _wait_until(lambda: not watchdog._items)
    gc.collect()
    assert len(DIED_IN) == 7 and set(DIED_IN) == {"MainThread"}
    with watchdog._cv:
        watchdog._spent.clear()
    gc.collect()
