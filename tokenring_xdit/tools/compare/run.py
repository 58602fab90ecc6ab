"""compare's orchestration: the three launches, then the report; and the CLI entry point."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

from ..cli_args import EXIT_FAILED, EXIT_OK, EXIT_USAGE, EXIT_WORKER, print_usage_error
from .config import (
    HOST_NAMES,
    MODEL_NAMES,
    RING_IMPL,
    RUNS,
    CompareConfig,
    Thresholds,
    resolve,
    thresholds_for,
)
from .estimate import Estimate, describe, estimate, matmul_flops_per_s
from .report import (
    build_report,
    compare_runs,
    merge_ranks,
    path_checks,
    print_summary,
    write_outputs,
)
from .workers import diffusers_worker, single_worker, xdit_worker

RING_WORKERS = {"xdit": xdit_worker, "diffusers": diffusers_worker}


def run_compare(
    cfg: CompareConfig,
    thresholds: Thresholds,
    out_dir: str,
    *,
    console=None,
    quiet: bool = False,
    timeout: float = 900.0,
    gain: float | None = None,
    verbose: bool = False,
    launcher: Callable | None = None,
) -> dict:
    """Run the three launches, write images, figure and JSON into `out_dir`; return the report.

    Raises tokenring_xdit.tools.launch.LaunchError when a rank fails.
    """
    from rich.console import Console

    from ..cli_args import rank_progress
    from ..launch import launch

    launcher = launcher or launch
    console = console or Console()
    progress = rank_progress("{task.fields[run]:<18}", console, quiet)
    ring_worker = RING_WORKERS[cfg.host]
    plan = [
        ("single", single_worker, 1, (cfg,)),
        ("ring", ring_worker, cfg.nproc, (cfg, RING_IMPL["ring"])),
        ("token_ring", ring_worker, cfg.nproc, (cfg, RING_IMPL["token_ring"])),
    ]
    runs: dict[str, dict] = {}
    load_before = _load_average()
    started = time.perf_counter()
    with progress:
        tasks = {
            name: progress.add_task("waiting", total=None, run=cfg.labels[name])
            for name, *_ in plan
        }
        for name, worker, nproc, worker_args in plan:
            task = tasks[name]

            lines = _StepLines(console, cfg.labels[name], quiet or console.is_terminal)

            def on_progress(rank: int, fields: dict, task=task, lines=lines) -> None:
                progress.update(task, **fields)
                lines(fields)

            values = launcher(
                worker,
                nproc,
                worker_args,
                device=cfg.device,
                timeout=timeout,
                env=None if verbose else _quiet_env(),
                on_progress=on_progress,
            )
            runs[name] = merge_ranks(name, values, cfg.host)
            progress.update(task, description="done")
    wall = time.perf_counter() - started
    comparisons = compare_runs(runs, thresholds)
    problems = path_checks(runs, cfg.host)
    passed = not problems and not any(c["failures"] for c in comparisons)
    report = build_report(cfg, thresholds, runs, comparisons, problems, passed, out_dir, wall)
    # other work on the machine moves the times (not the images): say how busy it was
    report["load_average_1min"] = dict(before=load_before, after=_load_average())
    write_outputs(cfg, runs, comparisons, report, out_dir, gain)
    return report


class _StepLines:
    """Progress as plain lines where the live display does not show (output to a file or a
    pipe): a phase or a denoising step, once LINE_EVERY_S has passed since the last line (so a
    seconds-long tiny run prints none, a full-size CPU run every step)."""

    LINE_EVERY_S = 10.0

    def __init__(self, console, label: str, off: bool):
        self.console, self.label, self.off = console, label, off
        self.total, self.done, self.phase = None, 0, ""
        self.started = self.last = time.monotonic()

    def __call__(self, fields: dict) -> None:
        self.total = fields.get("total", self.total)
        self.done = fields.get("completed", self.done) + fields.get("advance", 0)
        self.phase = fields.get("description", self.phase)
        now = time.monotonic()
        if self.off or now - self.last < self.LINE_EVERY_S:
            return
        self.last = now
        step = f", step {self.done}/{self.total}" if self.total else ""
        self.console.print(
            f"  {self.label}: {self.phase}{step} ({now - self.started:.0f} s)",
            markup=False,
            highlight=False,
        )


# The ranks' own logging, unless --verbose or set by the user: xDiT logs at DEBUG by default,
# diffusers and transformers warn about float32 modules and torchvision, torch about a renamed
# collective. Errors still show.
QUIET_ENV = {
    "LOG_LEVEL": "error",  # xfuser's logger
    "DIFFUSERS_VERBOSITY": "error",
    "TRANSFORMERS_VERBOSITY": "error",
    "PYTHONWARNINGS": "ignore::FutureWarning,ignore::DeprecationWarning",
}


def _quiet_env() -> dict[str, str]:
    return {k: v for k, v in QUIET_ENV.items() if k not in os.environ}


# A CPU run estimated longer than this gets a warning with the estimate first
LONG_RUN_S = 600.0
# Below this many operations the run is seconds long: no speed measurement
MEASURE_ABOVE_FLOPS = 1e11


def _cpu_cost(cfg: CompareConfig, cost: Estimate) -> Estimate:
    """A CPU run's estimate with its duration: the CPU's speed (torch) is measured only for a
    run that may be long."""
    return estimate(cfg, matmul_flops_per_s()) if cost.flops > MEASURE_ABOVE_FLOPS else cost


def _too_big(cfg: CompareConfig, cost: Estimate) -> str:
    return (
        f"{MODEL_NAMES[cfg.model]} {cfg.size} in {cfg.dtype} on CPU {describe(cost)}: its "
        f"weights alone do not fit on {cfg.nproc} ranks. {_faster(cfg)}, or --force to try"
    )


def _faster(cfg: CompareConfig) -> str:
    tiny = "" if cfg.size == "tiny" else "--size tiny runs in seconds; "
    return f"{tiny}a GPU per rank (--device cuda) runs the full size"


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def run_cli(args: argparse.Namespace) -> int:
    # usage errors first: nothing heavy (torch, rich) is imported until the arguments are good
    try:
        cfg = resolve(args)
        thresholds = thresholds_for(args, cfg.dtype)
    except ValueError as exc:  # the form argparse's own errors take (docs/compare.md)
        print_usage_error("compare", exc)
        return EXIT_USAGE
    cost = estimate(cfg, None) if cfg.device == "cpu" else None
    if cost is not None and cost.cannot_fit and not args.force:
        print_usage_error("compare", _too_big(cfg, cost))
        return EXIT_USAGE
    from rich.console import Console

    from ..launch import LaunchError

    console, err = Console(), Console(stderr=True)
    cost = cost and _cpu_cost(cfg, cost)
    warmup = f" after {cfg.warmup_steps} warm-up" if cfg.warmup_steps else ""
    console.print(
        f"[bold]tokenring-xdit compare[/]: {MODEL_NAMES[cfg.model]} ({cfg.size}, random "
        f"weights), {cfg.width}x{cfg.height}, {cfg.steps} steps{warmup}, {cfg.device} "
        f"{cfg.dtype}; "
        f"diffusers in 1 process, then {HOST_NAMES[cfg.host]} on {cfg.nproc} ranks (ulysses "
        f"{cfg.ulysses} x ring {cfg.ring}) with its ring and with TokenRing"
    )
    if cost is not None and (cost.may_not_fit or (cost.seconds or 0) > LONG_RUN_S):
        err.print(f"[yellow]warning:[/] on CPU this {describe(cost)}; {_faster(cfg)}")
    try:
        report = run_compare(
            cfg,
            thresholds,
            args.out,
            console=console,
            quiet=args.no_progress,
            timeout=args.timeout,
            gain=args.gain,
            verbose=args.verbose,
        )
    except LaunchError as exc:
        from ..cli_args import print_failure

        print_failure(err, exc, verbose=args.verbose)
        return EXIT_WORKER
    print_summary(console, report)
    files = report["files"]
    console.print(
        f"written to {args.out}/: {files['figure']} (side by side), {files['report']}, "
        f"{', '.join(files[n] for n in RUNS)}"
    )
    failures = [f for c in report["comparisons"] for f in c["failures"]]
    failures += report["path_problems"]
    if failures:
        err.print("[bold red]compare failed:[/] " + "; ".join(failures))
        return EXIT_FAILED
    console.print(f"[green]passed[/] ({report['wall_s']:.0f} s)")
    return EXIT_OK
