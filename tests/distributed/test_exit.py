"""A correct program that sets TokenRing up, calls it and falls off the end of the script
(no destroy_process_group) exits with code 0: TokenRing's own communicators are destroyed in
order at interpreter exit. Before, one rank died of SIGABRT ("terminate called without an
active exception") in about 1 run in 6 (gloo threads of our communicators torn down by the
interpreter's finalisation). benchmarks/exit_launches.py runs the 100-launch version.
"""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

PROGRAM = """
import datetime, torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
from tokenring_xdit import setup_token_ring_group, token_ring_attn
setup_token_ring_group(dist.group.WORLD)
q = torch.randn(1, 16, 2, 8)
with torch.no_grad():
    for _ in range(3):
        token_ring_attn(q, q, q)
"""
LAUNCHES = 6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(path, n: int = 2, timeout: float = 120) -> subprocess.CompletedProcess:
    """torchrun the program at `path` on n CPU ranks."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}",
           f"--master_port={_free_port()}", str(path)]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(600)
def test_program_without_destroy_exits_cleanly(tmp_path):
    path = tmp_path / "prog.py"
    path.write_text(PROGRAM)
    for i in range(LAUNCHES):
        done = launch(path)
        assert done.returncode == 0, f"launch {i}: rc {done.returncode}\n{done.stderr[-3000:]}"
        assert "terminate called" not in done.stderr, done.stderr[-3000:]
