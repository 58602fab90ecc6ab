"""The ring's NCCL lanes are aborted at once: measured on 2 x H200, an abort waits for
its communicator's queued work, which can wait on the other lane's stuck transfer, so aborts made
one after the other hung. These check the concurrency contract with stand-in groups (the NCCL
part itself is checked by tests/gpu/test_gpu_peer_death.py)."""

from __future__ import annotations

import threading
import time

import torch.distributed as dist

from tokenring_xdit.ring.comm import teardown


class _Group:  # weak-referenceable like a ProcessGroup
    pass


def test_lanes_abort_at_once(monkeypatch):
    """Each stand-in abort returns only once the other has started: sequential aborts would
    leave the first waiting (and the second never started)."""
    started = threading.Barrier(2, timeout=5)
    passed = []

    def abort(group):
        started.wait()  # BrokenBarrierError if the other abort never starts
        passed.append(group)

    monkeypatch.setattr(dist.distributed_c10d, "_abort_process_group", abort)
    lanes = [_Group(), _Group()]
    assert teardown.abort_together(lanes, timeout_s=10) == []
    assert sorted(map(id, passed)) == sorted(map(id, lanes))
    assert teardown.abort_together(lanes, timeout_s=10) == []  # aborted once: skipped now
    assert len(passed) == 2


def test_a_stuck_abort_is_reported_and_waited_for(monkeypatch):
    """An abort that does not end within the bound is returned; an error path waits for an
    abort in flight (bounded) instead of racing it."""
    release = threading.Event()
    monkeypatch.setattr(dist.distributed_c10d, "_abort_process_group", lambda g: release.wait())
    stuck = _Group()
    t0 = time.monotonic()
    assert teardown.abort_together([stuck], timeout_s=0.2) == [stuck]
    assert time.monotonic() - t0 < 2
    holder = threading.Thread(target=teardown.abort_together, args=([_Group()], 5.0))
    holder.start()
    time.sleep(0.1)
    t0 = time.monotonic()
    threading.Timer(0.3, release.set).start()
    teardown.wait_for_aborts(5.0)  # returns once the abort in flight has ended
    assert 0.15 < time.monotonic() - t0 < 4
    holder.join(5)
    assert not holder.is_alive()


def test_a_failed_ring_makes_the_exit_destroy_the_default_group(monkeypatch):
    """After a ring failed, the exit hook destroys the groups the program left (their teardown
    at interpreter finalisation ended NCCL survivors in std::terminate on 2 x H200)."""
    from datetime import timedelta

    from tokenring_xdit.ring.comm import RingComms

    monkeypatch.setattr(dist.distributed_c10d, "_abort_process_group", lambda g: None)
    monkeypatch.setattr(teardown.LIVE, "failed", False)
    assert teardown.abort_together([_Group()], timeout_s=5) == []
    assert not teardown.LIVE.failed  # a healthy teardown's abort
    ring = RingComms(None, (0,), None, None, None, timedelta(seconds=5), "nccl")
    ring.fail("a peer is gone")
    ring.fail("and again")
    assert teardown.LIVE.failed
    destroyed, aborted = [], []
    monkeypatch.setattr(teardown.LIVE, "made", True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda *a: "gloo")
    monkeypatch.setattr(dist, "destroy_process_group", lambda *a: destroyed.append(a))
    monkeypatch.setattr(dist.distributed_c10d, "_abort_process_group", lambda *a: aborted.append(a))
    monkeypatch.setattr(teardown, "release_ring_comms", lambda *a: None)
    teardown._at_exit()
    assert (destroyed, aborted) == ([()], [])  # gloo: destroyed (local)
    # NCCL after a failure: aborted (a destroy's finalise waits on a stopped peer)
    monkeypatch.setattr(dist, "get_backend", lambda *a: "nccl")
    teardown._at_exit()
    assert (destroyed, aborted) == ([()], [()])
    monkeypatch.setattr(teardown.LIVE, "failed", False)  # NCCL, nothing failed: torch's own exit
    teardown._at_exit()
    assert (destroyed, aborted) == ([()], [()])


def test_the_guard_aborts_every_group_after_a_failed_nccl_ring(monkeypatch):
    """destroy_process_group() (the world) after a ring failed on NCCL aborts instead: torch's
    destroy finalises each communicator and waits for a peer that may be alive but stopped."""
    calls = []
    guard = teardown._guarded(lambda *a, **k: calls.append(("destroy", a, k)))
    monkeypatch.setattr(dist.distributed_c10d, "_abort_process_group", lambda *a: calls.append(
        ("abort", a)))  # fmt: skip
    monkeypatch.setattr(teardown, "release_ring_comms", lambda *a: None)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda *a: "nccl")
    monkeypatch.setattr(teardown.LIVE, "failed", False)
    guard()
    monkeypatch.setattr(teardown.LIVE, "failed", True)
    sub = object()
    guard(sub)  # one group: destroyed as asked
    guard()
    guard(group=dist.GroupMember.WORLD)
    monkeypatch.setattr(dist, "get_backend", lambda *a: "gloo")
    guard()
    assert calls == [("destroy", (), {}), ("destroy", (sub,), {}), ("abort", ()), ("abort", ()),
                     ("destroy", (), {})]  # fmt: skip


def test_graphs_are_released_while_the_aborts_wait(monkeypatch):
    """`started` runs once every abort has begun and before they are waited for (NCCL's abort
    waits for the graphs that captured its communicator: the watchdog drops them there), and
    also when there is nothing left to abort."""
    release = threading.Event()
    begun = []

    def abort(group):
        begun.append(group)
        assert release.wait(5)  # ends only once the graphs are dropped

    def started():  # before the wait: else both aborts would time out and be returned
        release.set()

    monkeypatch.setattr(dist.distributed_c10d, "_abort_process_group", abort)
    lanes = [_Group(), _Group()]
    assert teardown.abort_together(lanes, timeout_s=10, started=started) == []
    assert len(begun) == 2
    again = []
    assert teardown.abort_together(lanes, timeout_s=10, started=lambda: again.append(1)) == []
    assert again == [1]
