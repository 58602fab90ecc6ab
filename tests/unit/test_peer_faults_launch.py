"""A rank still running at its scenario's wall prints every thread's stack before it is killed
(tests/peer_faults/launch.py): where a survivor that never raised was stuck."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.peer_faults import launch as peer_launch  # noqa: E402

STUCK = textwrap.dedent(
    """
    import faulthandler, signal, sys, threading, time
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    def parked_helper():
        time.sleep(60)
    threading.Thread(target=parked_helper, daemon=True).start()
    print("ready", flush=True)
    time.sleep(60)
    """
)


def test_a_rank_alive_at_the_wall_dumps_its_threads_then_is_killed():
    proc = subprocess.Popen(
        [sys.executable, "-c", STUCK], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "ready"
    killed = peer_launch._supervise({0: proc}, {0}, wall=0.5)
    err = proc.stderr.read()
    assert killed == [0] and proc.returncode == -9
    assert "parked_helper" in err and "<module>" in err, err  # both threads' stacks
