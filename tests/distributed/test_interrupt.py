"""A rank waiting for a missing peer on its first TokenRing call stops on Ctrl-C.

The first call makes the ring's communicators; torch makes them inside C++ waits where Python's
signal handlers cannot run, so a rank whose peer never called ignored Ctrl-C for the whole
deadline (30 minutes by default on gloo). ring/comm/groups.py now meets the members in a
Python polling loop first. Two plain processes (no launcher that would forward or escalate the
signal): rank 1 never calls TokenRing; rank 0 gets SIGINT while it waits.
"""

from __future__ import annotations

import signal
import subprocess
import time
from datetime import timedelta

from tests.harness import plain_ranks, run_ranks

PROGRAM = """
import sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    time.sleep(120)  # never calls TokenRing
    sys.exit(0)
from tokenring_xdit.ring import token_ring_attn
q = torch.randn(1, 8, 2, 16)
print("calling", flush=True)
try:
    token_ring_attn(q, q, q)
except BaseException as exc:
    print("raised", type(exc).__name__, str(exc)[:400], flush=True)
    raise
"""


def _launch(extra_env: dict[str, str]) -> list[subprocess.Popen]:
    return plain_ranks(PROGRAM, 2, extra_env, merge_stderr=True)


def _wait_for_line(proc: subprocess.Popen, want: str, timeout: float) -> list[str]:
    lines, end = [], time.monotonic() + timeout
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith(want):
            return lines
    raise AssertionError(f"no {want!r} line within {timeout} s: {''.join(lines)[-2000:]}")


def test_ctrl_c_stops_a_rank_whose_peer_never_calls():
    procs = _launch({"TOKENRING_XDIT_TIMEOUT": "600"})
    try:
        _wait_for_line(procs[0], "calling", 120)
        time.sleep(1.0)  # inside the first call's wait for rank 1
        start = time.monotonic()
        procs[0].send_signal(signal.SIGINT)
        procs[0].wait(timeout=30)
        took = time.monotonic() - start
        out = procs[0].stdout.read()
        assert "raised KeyboardInterrupt" in out, out[-2000:]
        # a bound on responsiveness (the old wait ignored the signal for the whole deadline)
        assert took < 5.0, f"rank 0 took {took:.1f} s to stop after SIGINT"
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_missing_peer_is_named_at_the_deadline():
    procs = _launch({"TOKENRING_XDIT_TIMEOUT": "3"})
    try:
        _wait_for_line(procs[0], "calling", 120)
        procs[0].wait(timeout=60)
        out = procs[0].stdout.read()
        assert "raised TokenRingCommError" in out, out[-2000:]
        assert "global ranks [1]" in out and "did not start TokenRing" in out, out[-2000:]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _restarted_member_waits(rank: int, world_size: int) -> float:
    """A worker group torchrun restarted: its store still holds the previous attempt's arrival
    keys (torchrun keeps its store across restarts). Rank 1 is late; rank 0 must wait for it."""
    import os

    from tokenring_xdit.ring.comm import groups

    os.environ["TORCHELASTIC_RESTART_COUNT"] = "0"  # the previous attempt arrived, then died
    groups._members_arrive((0, 1), timedelta(seconds=30))
    groups._ARRIVALS.clear()  # the restarted processes start afresh
    os.environ["TORCHELASTIC_RESTART_COUNT"] = "1"
    if rank == 1:
        time.sleep(2.0)
    start = time.monotonic()
    groups._members_arrive((0, 1), timedelta(seconds=30))
    return time.monotonic() - start


def test_a_restarted_group_does_not_meet_its_predecessors_keys():
    results = run_ranks(_restarted_member_waits, 2)
    assert all(r.ok for r in results), [r.trace for r in results]
    assert results[0].value > 1.5, results[0].value  # it waited for rank 1, not the stale key


def test_a_restarted_group_failing_to_connect_names_torchruns_shared_store(monkeypatch):
    from tokenring_xdit.ring.comm import groups

    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in groups._restart_hint()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert groups._restart_hint() == ""
