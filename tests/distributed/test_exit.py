"""A correct program that uses TokenRing exits with code 0, whatever its last collective was and
whether or not it calls destroy_process_group (docs/troubleshooting.md promises it).

Before, a program whose last collective was an ordinary one after a TokenRing call (an
all_gather, a barrier, `unshard`) died of SIGABRT ("terminate called without an active
exception") in about 1 run in 3: TokenRing's caches kept the default group alive past
destroy_process_group, so its gloo worker threads outlived the start of interpreter
finalisation and one of them, dropping the last reference to the finished collective, was
killed taking the GIL. Without destroy_process_group the same race exists in plain torch;
TokenRing's exit hook destroys a gloo default group the program left (ring/comm/teardown.py).
Each program is launched several times (the race is timing-dependent);
benchmarks/diagnostics/exit_launches.py runs the 100-launch version of PROGRAM.
tests/gpu/test_gpu_exit.py launches the same programs on 2 GPUs over NCCL.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import run_ranks, values
from tests.speed import scaled

REPO = Path(__file__).resolve().parents[2]

# backend, mode ("infer": three forward calls; "train": causal shard -> forward/backward ->
# optimizer step -> unshard), last (the program's last collective besides destroy), destroy
TEMPLATE = """
import datetime, os, torch, torch.distributed as dist
import tokenring_xdit as tr
BACKEND, MODE, LAST, DESTROY = {backend!r}, {mode!r}, {last!r}, {destroy!r}
dist.init_process_group(BACKEND, timeout=datetime.timedelta(seconds={timeout}))
device, dtype = torch.device("cpu"), torch.float32
if BACKEND == "nccl":
    device, dtype = torch.device("cuda", int(os.environ["LOCAL_RANK"])), torch.bfloat16
    torch.cuda.set_device(device)
torch.manual_seed(0)
if MODE == "train":
    x = torch.randn(1, 64, 2, 64, device=device, dtype=dtype)
    proj = torch.nn.Linear(64, 3 * 64).to(device, dtype)
    split = tr.make_split(64, dist.get_world_size(), causal=True)
    q, k, v = (t.contiguous() for t in proj(tr.shard(x, None, split=split, dim=1)).chunk(3, -1))
    out = tr.token_ring_attn_func(q, k, v, causal=True, split=split)
    out.float().square().mean().backward()
    with torch.no_grad():  # an SGD step (torch.optim would import torch._dynamo: seconds)
        for p in proj.parameters():
            p -= 0.1 * p.grad
    full = tr.unshard(out.detach(), None, split=split, dim=1)
else:
    tr.setup_token_ring_group(dist.group.WORLD)
    q = torch.randn(1, 64, 2, 64, device=device, dtype=dtype)
    with torch.no_grad():
        for _ in range(3):
            tr.token_ring_attn(q, q, q)
if LAST == "all_gather":
    one = torch.ones(1, device=device)
    dist.all_gather([torch.empty_like(one) for _ in range(dist.get_world_size())], one)
elif LAST == "barrier":
    dist.barrier()
if DESTROY:
    dist.destroy_process_group()
print("done", flush=True)
"""


def program(backend: str = "gloo", mode: str = "infer", last: str | None = None,
            destroy: bool = False, timeout: float = 30.0) -> str:  # fmt: skip
    """The text of one exit-test program (see TEMPLATE); `timeout`: its group's, in seconds."""
    return TEMPLATE.format(backend=backend, mode=mode, last=last, destroy=destroy, timeout=timeout)


# set-up, calls, no destroy: the program benchmarks/diagnostics/exit_launches.py launches
PROGRAM = program()

# (mode, last collective, destroy): the programs a user writes, each launched LAUNCHES times
# (PROGRAM, whose last collective is TokenRing's, is the no-destroy path of the last case too)
CASES = [
    ("infer", "all_gather", True),
    ("infer", "barrier", False),
    ("train", "all_gather", True),
    ("train", None, False),  # unshard's all_gather is the last collective
]
LAUNCHES = 1  # the direct reference check below catches the cause deterministically


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(path, n: int = 2, timeout: float = 120) -> subprocess.CompletedProcess:
    """torchrun the program at `path` on n ranks (`timeout` stretched on a slow machine)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}",
           f"--master_port={_free_port()}", str(path)]  # fmt: skip
    path_env = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path_env}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=scaled(timeout), env=env)


def check_launches(path, launches: int, n: int = 2, timeout: float = 120) -> None:
    """Launch the program `launches` times: every launch exits 0 and every rank printed done."""
    for i in range(launches):
        done = launch(path, n, timeout)
        tail = f"launch {i}: rc {done.returncode}\n{done.stderr[-3000:]}"
        assert done.returncode == 0, tail
        assert "terminate called" not in done.stderr, tail
        assert done.stdout.count("done") == n, f"launch {i}: stdout {done.stdout[-500:]!r}\n{tail}"


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("mode", "last", "destroy"), CASES)
def test_program_exits_cleanly(tmp_path, mode, last, destroy):
    path = tmp_path / "prog.py"
    path.write_text(program("gloo", mode, last, destroy, timeout=scaled(30)))
    check_launches(path, LAUNCHES)


def _world_outlives_teardown(rank: int, world_size: int, init_file: str) -> list[bool]:
    """After TokenRing calls and an all_gather: is the default group still alive (still has its
    gloo threads) after destroy_process_group, and after the exit hook in a program that did
    not destroy it? Each must be False."""
    import gc
    import weakref

    import torch
    import torch.distributed as dist

    import tokenring_xdit as tr
    from tokenring_xdit.ring.comm import teardown

    def calls() -> tuple[weakref.ref, torch.Tensor]:
        q = torch.randn(1, 16, 2, 8)
        tr.token_ring_attn(q, q, q)
        split = tr.make_split(16, world_size, causal=True)
        x = tr.shard(torch.randn(1, 16, 2, 8, requires_grad=True), None, split=split, dim=1)
        out = tr.token_ring_attn_func(x, x, x, causal=True, split=split)
        out.sum().backward()
        dist.all_gather([torch.empty(1) for _ in range(world_size)], torch.ones(1))
        # the output stays referenced, as a training script's module-level `out` does: its
        # autograd node must not keep the group alive (it held the ring: an abort at exit)
        return weakref.ref(dist.group.WORLD), out

    alive = []
    world, kept = calls()
    dist.destroy_process_group()
    gc.collect()
    alive.append(world() is not None)
    dist.init_process_group("gloo", f"file://{init_file}", rank=rank, world_size=world_size)
    world, kept = calls()
    teardown._at_exit()  # what interpreter exit runs first
    gc.collect()
    alive.append(world() is not None or dist.is_initialized())
    del kept
    return alive


def test_no_reference_keeps_the_default_group_alive(tmp_path):
    # the cause of the abort, checked directly (the launches above only catch it 1 time in 3)
    results = run_ranks(_world_outlives_teardown, 2, str(tmp_path / "init"), timeout=120)
    assert values(results) == [[False, False]] * 2
