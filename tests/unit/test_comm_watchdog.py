"""The deadline's watchdog never destroys a CUDA event in its own thread: on 4 x H200
a survivor whose replay was stuck never raised because the watchdog sat in cuEventDestroy,
waiting for a driver lock while the main thread's cuGraphLaunch was blocked behind the stuck
replay. The calling thread's next watch() takes finished calls' events back for reuse (no
event is created or destroyed per call in steady state) and drops expired ones.
Runs the real watchdog thread with stand-in events (no GPU here) that record where they die."""

from __future__ import annotations

import gc
import threading
import time
from datetime import timedelta

from tokenring_xdit.ring.comm import watchdog

DIED_IN: list[str] = []
MADE: list[int] = []


class _Event:
    """Stands in for torch.cuda.Event: done at once, or never (`stuck`)."""

    stuck = False

    def __init__(self) -> None:
        MADE.append(1)

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


def test_events_are_reused_and_die_only_in_the_calling_thread(monkeypatch):
    monkeypatch.setattr(watchdog.torch.cuda, "Event", _Event)
    monkeypatch.setattr(watchdog.torch.cuda, "current_device", lambda: 0)
    expired = []
    monkeypatch.setattr(watchdog, "_expire", lambda comms, what: expired.append(what[0]))
    watchdog.WATCHDOG.clear()
    DIED_IN.clear()
    MADE.clear()
    comms = _Comms(60.0)
    for i in range(5):  # finished calls: the watchdog sets each aside, the next watch reuses it
        watchdog.watch(comms, f"call {i}")
        _wait_until(lambda: not watchdog.WATCHDOG.items)
    gc.collect()
    assert len(MADE) == 1 and DIED_IN == []

    # a stuck call past its deadline, with a later call of the same ring queued behind it
    monkeypatch.setattr(_Event, "stuck", True)
    stuck = _Comms(0.05)
    watchdog.watch(stuck, "stuck call")
    watchdog.watch(stuck, "queued call")
    _wait_until(lambda: expired == ["stuck call"] and not watchdog.WATCHDOG.items)
    time.sleep(0.05)
    gc.collect()
    assert DIED_IN == []  # nothing died in the watchdog's thread
    monkeypatch.setattr(_Event, "stuck", False)
    watchdog.watch(comms, "after")  # drops what the watchdog set aside, here
    _wait_until(lambda: not watchdog.WATCHDOG.items)
    gc.collect()
    assert DIED_IN == ["MainThread"] * 2  # the expired call's events; finished ones are reused
    watchdog.WATCHDOG.clear()
    gc.collect()
