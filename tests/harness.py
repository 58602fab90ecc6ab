"""Run a function on N real torch.distributed ranks (spawned processes, gloo on CPU).

A rank that raises, or a run that outlives its deadline (a hang), fails the caller: every rank's
outcome comes back, all processes are killed at the deadline, and groups are destroyed in
`finally`. `fn` must be a module-level function (spawn pickles it by reference).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any


@dataclass
class RankResult:
    rank: int
    value: Any = None
    error_type: str | None = None
    error: str | None = None
    trace: str | None = None

    @property
    def ok(self) -> bool:
        return self.error_type is None


def _worker(fn, rank, world_size, init_file, args, env, results, pg_timeout, backend):
    os.environ.update(env)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend,
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=pg_timeout),
        )
        value = fn(rank, world_size, *args)
        results.put(RankResult(rank, value))
    except BaseException as exc:  # report everything, the parent decides
        results.put(RankResult(rank, None, type(exc).__name__, str(exc), traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(
    fn: Callable,
    world_size: int,
    *args: Any,
    timeout: float = 180.0,
    env: dict[str, str] | None = None,
    backend: str = "gloo",
) -> list[RankResult]:
    """Run fn(rank, world_size, *args) on `world_size` ranks (gloo; "nccl": one GPU each);
    results in rank order."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [
            ctx.Process(
                target=_worker,
                args=(
                    fn,
                    r,
                    world_size,
                    init_file,
                    args,
                    dict(env or {}),
                    results,
                    timeout,
                    backend,
                ),
                daemon=True,
            )
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        got: dict[int, RankResult] = {}
        deadline = time.monotonic() + timeout
        try:
            while len(got) < world_size and time.monotonic() < deadline:
                try:
                    res = results.get(timeout=0.5)
                    got[res.rank] = res
                except queue.Empty:
                    if all(not p.is_alive() for p in procs) and results.empty():
                        break
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
                    p.join()
    missing = [r for r in range(world_size) if r not in got]
    if missing:
        raise TimeoutError(
            f"ranks {missing} of {world_size} gave no result within {timeout:.0f}s (hang or crash);"
            f" others: {[(r.rank, r.error_type) for r in got.values()]}"
        )
    return [got[r] for r in range(world_size)]


def values(results: list[RankResult]) -> list[Any]:
    """Every rank's value, or an AssertionError carrying the first failing rank's traceback."""
    for r in results:
        if not r.ok:
            raise AssertionError(f"rank {r.rank} raised {r.error_type}: {r.error}\n{r.trace}")
    return [r.value for r in results]
