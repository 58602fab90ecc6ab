"""The NCCL deadline (ring/comm/watchdog.py) on one GPU: a call whose GPU work does not finish
within the ring's deadline marks the ring unusable (the next call raises TokenRingCommError),
work that finishes in time leaves it usable, and watching costs the host a few microseconds."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch

from tokenring_xdit.ring.comm import RingComms, TokenRingCommError
from tokenring_xdit.ring.comm.watchdog import watch

pytestmark = pytest.mark.gpu


def _comms(deadline_s: float) -> RingComms:
    # no communicators of our own to abort: the deadline logic alone
    return RingComms(None, (0,), None, None, None, timedelta(seconds=deadline_s), "nccl")


def test_work_past_the_deadline_marks_the_ring_unusable():
    comms = _comms(0.05)
    torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time: a transfer that never arrives
    watch(comms, "forward")
    time.sleep(0.5)
    assert comms.failed is not None and "did not finish within" in comms.failed
    with pytest.raises(TokenRingCommError, match="unusable after an earlier failure"):
        comms.ensure_usable()
    torch.cuda.synchronize()


def test_work_within_the_deadline_keeps_the_ring_usable():
    comms = _comms(5.0)
    torch.cuda._sleep(10_000_000)
    watch(comms, "forward")
    torch.cuda.synchronize()
    time.sleep(0.05)
    comms.ensure_usable()


def test_watch_host_cost_is_microseconds():
    comms = _comms(60.0)
    for _ in range(100):
        watch(comms, "forward")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(2000):
        watch(comms, "forward")
    per_call_us = (time.perf_counter() - t0) / 2000 * 1e6
    torch.cuda.synchronize()
    print(f"watch(): {per_call_us:.2f} us host time per call")
    assert comms.failed is None
