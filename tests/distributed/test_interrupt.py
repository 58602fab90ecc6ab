"""A rank waiting for a missing peer on its first TokenRing call stops on Ctrl-C.

The first call makes the ring's communicators; torch makes them inside C++ waits where Python's
signal handlers cannot run, so a rank whose peer never called ignored Ctrl-C for the whole
deadline (30 minutes by default on gloo). ring/comm/groups.py now meets the members in a
Python polling loop first. Two plain processes (no launcher that would forward or escalate the
signal): rank 1 never calls TokenRing; rank 0 gets SIGINT while it waits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from tests.harness import plain_ranks, run_ranks
from tests.speed import scaled

REPO = Path(__file__).resolve().parents[2]

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
    raise AssertionError(f"no {want!r} line within {timeout:.0f} s: {''.join(lines)[-2000:]}")


def test_ctrl_c_stops_a_rank_whose_peer_never_calls():
    procs = _launch({"TOKENRING_XDIT_TIMEOUT": "600"})
    try:
        _wait_for_line(procs[0], "calling", scaled(120))
        time.sleep(1.0)  # inside the first call's wait for rank 1
        start = time.monotonic()
        procs[0].send_signal(signal.SIGINT)
        procs[0].wait(timeout=scaled(30))
        took = time.monotonic() - start
        out = procs[0].stdout.read()
        assert "raised KeyboardInterrupt" in out, out[-2000:]
        # a bound on responsiveness (the old wait ignored the signal for the whole deadline)
        assert took < scaled(5.0), f"rank 0 took {took:.1f} s to stop after SIGINT"
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_missing_peer_is_named_at_the_deadline():
    procs = _launch({"TOKENRING_XDIT_TIMEOUT": "3"})
    try:
        _wait_for_line(procs[0], "calling", scaled(120))
        procs[0].wait(timeout=scaled(60))
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

    from tokenring_xdit.ring.comm import groups

    os.environ["TORCHELASTIC_RESTART_COUNT"] = "0"  # the previous attempt arrived, then died
    groups._members_arrive((0, 1), timedelta(seconds=30))
    groups.LIVE.arrivals.clear()  # the restarted processes start afresh
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


# A CI time limit sends SIGTERM to the pytest run: the launcher must let it stop the run (as
# Ctrl-C does), not turn it into one failed test after which the run goes on.
INNER = """
from tests.distributed.test_demo import _sleeps
from tokenring_xdit.tools.launch import launch


def test_launching():
    print("launching", flush=True)
    launch(_sleeps, 2, timeout=600)


def test_after():
    open({mark!r}, "w").close()
"""


def test_sigterm_stops_a_pytest_run_inside_a_launch(tmp_path):
    mark = tmp_path / "the-next-test-ran"
    (tmp_path / "test_inner.py").write_text(INNER.format(mark=str(mark)))
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    argv = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:xdist", "-p", "no:cacheprovider",
            "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        lines = []
        while not any("launching" in line for line in lines):
            line = proc.stdout.readline()
            assert line, "".join(lines)[-2000:]
            lines.append(line)
        time.sleep(1.0)  # the ranks are starting
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=scaled(60))
        out = "".join(lines) + proc.stdout.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # only this test's own session
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out[-3000:]
    assert "Terminated" in out and not mark.exists(), out[-3000:]


# An example's rank (tools/rank_exit.exit_on_interrupt, installed by run_main): rank 0 is in one
# long C++ call (20 squarings of a 3000 x 3000 matrix: tens of seconds on one thread), where
# Python's own handler cannot run until it returns; rank 1 in a Python sleep.
BLOCKED = """
import time, torch, torch.distributed as dist
from tokenring_xdit.tools.rank_exit import exit_on_interrupt
exit_on_interrupt()
dist.init_process_group("gloo")
torch.set_num_threads(1)
print("waiting", flush=True)
if dist.get_rank() == 0:
    torch.linalg.matrix_power(torch.rand(3000, 3000), 2**20)
else:
    time.sleep(600)
"""


def test_ctrl_c_ends_each_rank_at_once_with_one_line():
    procs = plain_ranks(BLOCKED, 2)
    try:
        for p in procs:
            assert p.stdout.readline() == "waiting\n", p.stderr.read()[-2000:]
        time.sleep(0.5)  # rank 0 is inside the C++ call
        start = time.monotonic()
        for p in procs:  # what a terminal's Ctrl-C does: every process of the job gets SIGINT
            p.send_signal(signal.SIGINT)
        for p in procs:
            p.wait(timeout=scaled(30))
        took = time.monotonic() - start
        for rank, p in enumerate(procs):
            err = p.stderr.read()
            assert err == f"rank {rank}: interrupted (SIGINT)\n", err[-2000:]
            assert p.returncode == 128 + signal.SIGINT, (rank, p.returncode)
        assert took < scaled(5.0), took  # not at the end of the C++ call
    finally:
        for p in procs:
            p.kill()
            p.wait()
