"""Start N local torch.distributed ranks, collect one result from each, and never hang.

Each rank is a spawned process (gloo on CPU; NCCL with GPU `rank` when device="cuda") that meets
the others through a file in a temporary directory. A rank's return value, its progress reports and
its exception (with traceback) come back through one queue; a return value travels as plain
pickle bytes (tensors by value), so the rank may exit before the launcher reads it. The first
failure, a rank that dies without a word (segfault, OOM kill) or the deadline ends the run: every
process is killed and `LaunchError` says which rank did what.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import queue
import signal
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

__all__ = [
    "LaunchError",
    "RankFailure",
    "RankOutcome",
    "Reporter",
    "Terminated",
    "launch",
    "launch_outcomes",
    "threads_per_rank",
]

# After the first failure the other ranks get this long to report theirs (often the same error)
# before they are killed: a rank blocked in a collective with a dead peer never returns.
FAILURE_GRACE_S = 3.0
# A process that is gone must have flushed its queue by then, or it died without reporting.
SILENT_DEATH_S = 1.0


@dataclass(frozen=True)
class RankFailure:
    rank: int
    error_type: str
    message: str
    trace: str = ""  # the formatted stack frames ("Traceback ..." up to, not incl., the error)
    reported: bool = True  # False: the launcher's verdict (the rank died or hung silently)

    def __str__(self) -> str:
        """One line: the rank, the exception type and the first line of its message."""
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        if len(first) > 300:  # cut at a word, and say so
            first = first[:300].rsplit(" ", 1)[0] + " ..."
        return f"rank {self.rank}: {self.error_type}: {first}"


class LaunchError(RuntimeError):
    """A rank raised, crashed, or the run outlived its timeout; all processes are gone.

    `failures` lists the failing ranks in the order their failures arrived.
    """

    def __init__(self, message: str, failures: list[RankFailure] | None = None):
        super().__init__(message)
        self.failures = list(failures or [])


@dataclass(frozen=True)
class RankOutcome:
    """One rank's end: its return value, or how it failed."""

    rank: int
    value: Any = None
    failure: RankFailure | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


class Reporter:
    """Handed to the worker function: `report(description=..., total=..., advance=...)`.

    Sends a progress event to the launching process (cheap, but not free: keep it out of timed
    loops).
    """

    def __init__(self, events, rank: int):
        self._events = events
        self.rank = rank

    def __call__(self, **fields: Any) -> None:
        self._events.put(("progress", self.rank, fields))


def threads_per_rank(nproc: int) -> int:
    """CPU threads each rank may use so that the ranks do not fight over cores."""
    return max(1, (os.cpu_count() or 1) // nproc)


def _worker(fn, rank, nproc, device, init_file, args, events, pg_timeout_s):
    report = Reporter(events, rank)
    try:
        import torch
        import torch.distributed as dist

        # No device_id: an eagerly bound NCCL world breaks new_group() for xDiT's ulysses /
        # PipeFusion groups (xfuser 0.7.0 parallel_state warns about it).
        if device == "cuda":
            torch.cuda.set_device(rank)
            backend = "nccl"
        else:
            torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or threads_per_rank(nproc)))
            backend = "gloo"
        report(description="connecting")
        dist.init_process_group(
            backend,
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=nproc,
            timeout=timedelta(seconds=pg_timeout_s),
        )
    except BaseException as exc:
        events.put(("error", rank, _failure(rank, exc)))
        return
    try:
        # By value: through the queue torch would share a tensor's storage by a file descriptor
        # its process serves, and a rank that exits before the launcher unpickles it leaves the
        # launcher a FileNotFoundError (seen with two test workers on 2 loaded cores)
        events.put(("result", rank, pickle.dumps(fn(rank, nproc, report, *args))))
    except BaseException as exc:  # report everything; the launcher decides
        events.put(("error", rank, _failure(rank, exc)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    from .rank_exit import exit_without_teardown

    # the exit handlers flush the queue; the interpreter's teardown (seconds with diffusers
    # and xDiT loaded, and the launcher waits for it) is skipped
    exit_without_teardown(0)


def _failure(rank: int, exc: BaseException) -> RankFailure:
    frames = "".join(traceback.format_tb(exc.__traceback__))
    frames = f"Traceback (most recent call last):\n{frames}"
    return RankFailure(rank, type(exc).__name__, str(exc), frames)


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    """Set variables while children start, so they hold before the child imports anything."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Terminated(KeyboardInterrupt):
    """SIGTERM during a launch, raised like Ctrl-C's KeyboardInterrupt: it unwinds the same way
    (ranks stopped, temporary files removed) and stops what Ctrl-C stops, e.g. a whole pytest
    run on a CI time limit, not only the test that was launching (a SystemExit is one failed
    test, and the run went on). `exit_code` is the shell's code for "killed by SIGTERM"."""

    exit_code = 128 + signal.SIGTERM


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """SIGTERM ends this process as Ctrl-C does: through the `finally` blocks that stop the ranks,
    close the queue and remove the temporary directory (its default action skips them all and
    leaves the directory and the queue's semaphores behind). Someone else's handler is kept."""
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def stop(signum, frame):
        raise Terminated()

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def launch(
    fn: Callable[..., Any],
    nproc: int,
    args: tuple = (),
    *,
    device: str = "cpu",
    timeout: float = 600.0,
    env: dict[str, str] | None = None,
    on_progress: Callable[[int, dict[str, Any]], None] | None = None,
) -> list[Any]:
    """Run `fn(rank, nproc, report, *args)` on `nproc` ranks; return the values in rank order.

    `fn` must be a module-level function (spawn pickles it by reference), `args` picklable.
    `on_progress(rank, fields)` is called in this process for each `report(**fields)`.
    Raises LaunchError on the first failure, a silent death or the timeout, after killing all.
    """
    results, failures = _launch(fn, nproc, args, device, timeout, env, on_progress, True)
    if failures:  # in order of arrival: the first is usually the cause, the rest its echoes
        first = next(iter(failures.values()))
        raise LaunchError(
            f"{len(failures)} of {nproc} rank(s) failed; first: {first}", list(failures.values())
        )
    return [results[r] for r in range(nproc)]


def launch_outcomes(
    fn: Callable[..., Any],
    nproc: int,
    args: tuple = (),
    *,
    device: str = "cpu",
    timeout: float = 600.0,
    env: dict[str, str] | None = None,
) -> list[RankOutcome]:
    """Like `launch`, but wait for every rank (until `timeout`) and return each one's outcome
    instead of raising: for callers that expect ranks to fail (tests of error paths)."""
    results, failures = _launch(fn, nproc, args, device, timeout, env, None, False)
    return [RankOutcome(r, results.get(r), failures.get(r)) for r in range(nproc)]


def _launch(fn, nproc, args, device, timeout, env, on_progress, fail_fast):
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    child_env = {}
    if device == "cpu" and "OMP_NUM_THREADS" not in os.environ:  # the user's choice wins
        child_env["OMP_NUM_THREADS"] = str(threads_per_rank(nproc))
    child_env.update(env or {})
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    with _sigterm_unwinds(), tempfile.TemporaryDirectory(prefix="tokenring-xdit-") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [
            ctx.Process(
                target=_worker,
                name=f"tokenring-xdit-rank{rank}",
                daemon=True,
                args=(fn, rank, nproc, device, init_file, args, events, timeout),
            )
            for rank in range(nproc)
        ]
        results: dict[int, Any] = {}
        failures: dict[int, RankFailure] = {}
        try:
            with _environ(child_env):
                for p in procs:
                    p.start()
            # after a failure the others get a grace period, or (not fail_fast) the whole timeout
            grace = FAILURE_GRACE_S if fail_fast else float("inf")
            results, failures = _collect(procs, events, timeout, on_progress, grace)
        finally:
            _stop(procs, graceful=len(results) == nproc)
            events.close()
    return results, failures


def _collect(procs, events, timeout, on_progress, grace):
    nproc = len(procs)
    results: dict[int, Any] = {}
    failures: dict[int, RankFailure] = {}
    deadline = time.monotonic() + timeout
    failed_at = None
    dead_since: dict[int, float] = {}
    while len(results) + len(failures) < nproc:
        now = time.monotonic()
        if failed_at is not None and now > failed_at + grace:
            break
        if now > deadline:
            silent = [r for r in range(nproc) if r not in results and r not in failures]
            for r in silent:
                failures[r] = RankFailure(
                    r,
                    "TimeoutError",
                    f"no result within {timeout:.0f} s (a hang, or too slow: raise --timeout)",
                    reported=False,
                )
            break
        try:
            kind, rank, payload = events.get(timeout=0.1)
        except queue.Empty:
            for rank, p in enumerate(procs):
                if p.is_alive() or rank in results or rank in failures:
                    continue
                since = dead_since.setdefault(rank, now)
                if now - since > SILENT_DEATH_S:
                    failures[rank] = RankFailure(
                        rank,
                        "ProcessDied",
                        f"exited with {_exit_reason(p.exitcode)} "
                        "without reporting a result (crash or out of memory?)",
                        reported=False,
                    )
                    failed_at = failed_at or now
            continue
        if kind == "progress":
            if on_progress is not None:
                on_progress(rank, payload)
        elif kind == "result":
            results[rank] = pickle.loads(payload)
        else:
            failures[rank] = payload
            failed_at = failed_at or now
    return results, failures


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {-code}"
    return f"code {code}"


def _stop(procs, graceful: bool) -> None:
    """Kill every rank still running; after a success first give them a moment to exit."""
    deadline = time.monotonic() + (5.0 if graceful else 0.0)
    for p in procs:
        if p.pid is not None:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        if p.pid is not None:
            p.join(timeout=5.0)
