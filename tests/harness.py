"""Run a function on N real torch.distributed ranks for a test (gloo on CPU, NCCL on GPUs).

A thin layer over the product's launcher (`tokenring_xdit.tools.launch.launch_outcomes`): every
rank's outcome comes back (tests of error paths expect ranks to raise), all processes are killed
at the deadline, groups are destroyed in `finally`. A rank that hangs or dies without a word
fails the caller with TimeoutError. `fn(rank, world_size, *args)` must be module-level.
Every `timeout` here is a deadline set on the reference machine: it is stretched by
`tests.speed.slowness()` on a slower or busier one.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.speed import scaled
from tokenring_xdit.tools.launch import launch_outcomes


@dataclass
class RankResult:
    rank: int
    value: Any = None
    error_type: str | None = None
    error: str | None = None
    trace: str | None = None
    seconds: float | None = None  # run_cases: how long this rank spent in the case

    @property
    def ok(self) -> bool:
        return self.error_type is None


def _without_report(fn: Callable, rank: int, world_size: int, report, *args: Any) -> Any:
    return fn(rank, world_size, *args)


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
    timeout = scaled(timeout)
    outcomes = launch_outcomes(
        functools.partial(_without_report, fn),
        world_size,
        args,
        device="cuda" if backend == "nccl" else "cpu",
        timeout=timeout,
        env={"OMP_NUM_THREADS": "1", **(env or {})},
    )
    silent = [o.failure for o in outcomes if o.failure and not o.failure.reported]
    if silent:
        raise TimeoutError(
            f"ranks {[f.rank for f in silent]} of {world_size} gave no result within "
            f"{timeout:.0f}s (hang or crash): {'; '.join(map(str, silent))}; others: "
            f"{[(o.rank, o.failure.error_type if o.failure else None) for o in outcomes]}"
        )
    return [
        RankResult(o.rank, o.value)
        if o.ok
        else RankResult(
            o.rank,
            None,
            o.failure.error_type,
            o.failure.message,
            f"{o.failure.trace}{o.failure.error_type}: {o.failure.message}",
        )
        for o in outcomes
    ]


def run_cases(
    fn: Callable,
    world_size: int,
    cases: Sequence[str],
    *args: Any,
    envs: Mapping[str, Mapping[str, str]] | None = None,
    group_timeout: float = 60.0,
    timeout: float = 180.0,
    env: dict[str, str] | None = None,
) -> dict[str, list[RankResult]]:
    """Every case of `cases` in ONE launch of `world_size` ranks (what a launch costs, mostly
    importing torch on every rank, is paid once): `fn(rank, world_size, group, case, *args)` runs
    on a group of all ranks made for that case alone (timeout `group_timeout`), so what a failed
    call leaves on its group cannot reach the next case. `envs[case]` is set in the ranks'
    environment for that case only, and what a case sets there itself is undone after it. Each
    rank's outcome of each case comes back as a RankResult (with its seconds), by case name. A
    rank that hangs or dies fails the launch naming the case each rank was in. Deadlines are
    stretched as run_ranks does."""
    with tempfile.TemporaryDirectory(prefix="tokenring-cases-") as progress:
        try:
            per_rank = values(
                run_ranks(_cases_worker, world_size, fn, progress, list(cases), dict(envs or {}),
                          scaled(group_timeout), *args, timeout=timeout, env=env)
            )  # fmt: skip
        except (TimeoutError, AssertionError) as exc:
            where = _cases_in(progress)
            raise AssertionError(f"{exc}\nthe case each rank was in: {where}") from exc
    return {case: [mine[case] for mine in per_rank] for case in cases}


def _cases_in(progress: str) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(Path(progress).iterdir())}


def _cases_worker(rank, world_size, fn, progress, cases, envs, group_timeout_s, *args):
    import torch.distributed as dist

    done = {}
    for case in cases:
        Path(progress, f"rank {rank}").write_text(case)
        # every rank done with the last case first (the world group's long timeout): a rank that
        # raised early must not start connecting the case's group, bounded by its short timeout,
        # while a peer still waits out the last case's deadline (seen: "Connection refused")
        dist.barrier()
        group = dist.new_group(list(range(world_size)), timeout=timedelta(seconds=group_timeout_s))
        before = dict(os.environ)  # the case may set variables itself too
        os.environ.update(envs.get(case, {}))
        start = time.monotonic()
        try:
            done[case] = RankResult(rank, fn(rank, world_size, group, case, *args))
        except Exception as exc:  # the case's outcome; the next case runs on its own group
            trace = "".join(traceback.format_exception(exc))
            done[case] = RankResult(rank, None, type(exc).__name__, str(exc), trace)
        finally:
            for k in set(os.environ) - set(before):
                del os.environ[k]
            os.environ.update(before)
        done[case].seconds = time.monotonic() - start
    Path(progress, f"rank {rank}").write_text("(past the last case)")
    return done


def values(results: list[RankResult]) -> list[Any]:
    """Every rank's value, or an AssertionError carrying the first failing rank's traceback."""
    for r in results:
        if not r.ok:
            raise AssertionError(f"rank {r.rank} raised {r.error_type}: {r.error}\n{r.trace}")
    return [r.value for r in results]


def plain_ranks(
    program: str, n: int, env: dict[str, str] | None = None, *, merge_stderr: bool = False
) -> list[subprocess.Popen]:
    """`python -c program` as ranks 0..n-1 of one env:// group on a free local port: plain
    processes, no launcher that would forward signals or stop the others when one dies (what
    fault and signal tests need). Output is piped; the caller waits for and kills them."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    repo = str(Path(__file__).resolve().parents[1])
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(n))
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, base.get("PYTHONPATH")]))
    base.update(env or {})
    stderr = subprocess.STDOUT if merge_stderr else subprocess.PIPE
    return [
        subprocess.Popen(
            [sys.executable, "-u", "-c", program],
            env=dict(base, RANK=str(r)),
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        for r in range(n)
    ]


def torchrun_script(
    script: str, *args: str, nproc: int = 2, timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`torchrun --nproc-per-node nproc <repo>/script args` as a user types it (output captured):
    the tests of examples and benchmarks that are meant to be launched that way."""
    repo = Path(__file__).resolve().parents[1]
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(repo)) if env is None else env
    return subprocess.run(
        [str(torchrun), "--nproc-per-node", str(nproc), str(repo / script), *args],
        env=env, capture_output=True, text=True, timeout=scaled(timeout),
    )  # fmt: skip


def hot_path_host(out: Path, *args: str, timeout: float = 500) -> dict:
    """benchmarks/diagnostics/hot_path_host.py run with `args` writing to `out`; its row."""
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, str(repo / "benchmarks/diagnostics/hot_path_host.py"), *args,
         "--out", str(out)],
        cwd=repo, env=dict(os.environ, PYTHONPATH=str(repo)), capture_output=True, text=True,
        timeout=scaled(timeout),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(Path(out).read_text())


def tiny_llama_config(layers: int = 2, kv_heads: int = 2, **extra: Any):
    """The tests' tiny random GQA Llama (64-token vocabulary, width 32, 4 query heads)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=64, **extra,
    )  # fmt: skip
