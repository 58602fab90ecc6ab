"""`tokenring-xdit demo`: its arguments, the "auto" settings, the launch and the results table.

The ranks' work is tools/demo.py (run_demo). Importing this module is cheap (argparse only):
torch and rich load when the subcommand runs.
"""

from __future__ import annotations

import argparse
import functools
import json

from ..ring.kernels.names import DENSE, runs_on
from .cli_args import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_WORKER,
    add_device_and_dtype,
    gpu_count,
    non_negative_int,
    positive_int,
    positive_seconds,
    print_failure,
    print_usage_error,
    rank_progress,
)

__all__ = ["add_arguments", "run", "KERNEL_CHOICES", "METHOD_CHOICES"]

KERNEL_CHOICES = ("auto", *DENSE)  # the kernels' names (ring/kernels/names.py: no torch)
METHOD_CHOICES = ("single", "tokenring", "yunchang")
DEFAULT_TOKENS = {"cpu": 1024, "cuda": 4096}
DEFAULT_DTYPE = {"cpu": "float32", "cuda": "bfloat16"}
CPU_KERNELS = ("auto", *runs_on("cpu"))

# Exit codes (cli_args): 0 all methods within tolerance, 1 a method's error above it, 2 bad
# arguments (argparse's own), 3 a worker failed or timed out.
EXIT_INACCURATE = EXIT_FAILED


def _methods(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    bad = [n for n in names if n not in METHOD_CHOICES]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown method(s) {bad or [text]}; use a comma list of {', '.join(METHOD_CHOICES)}"
        )
    return names


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nproc",
        type=positive_int,
        default=None,
        help="ranks to start (default: the GPU count with CUDA, at least 2; else 2)",
    )
    add_device_and_dtype(p)
    p.add_argument(
        "--tokens",
        type=positive_int,
        default=None,
        help="total sequence length, a multiple of --nproc (default "
        f"{DEFAULT_TOKENS['cuda']} on GPU, {DEFAULT_TOKENS['cpu']} on CPU)",
    )
    # (flag, type, default, help): the plain counts
    for flag, kind, default, text in (
        ("--heads", positive_int, 16, "attention heads (default 16)"),
        ("--head-size", positive_int, 72, "head size (default 72: PixArt-alpha's 16x72)"),
        ("--batch", positive_int, 1, "batch size (default 1)"),
        ("--iters", positive_int, 20, "timed calls per method (20)"),
        ("--warmup", non_negative_int, 5, "untimed calls per method before timing (5)"),
    ):
        p.add_argument(flag, type=kind, default=default, help=text)
    p.add_argument(
        "--kernel",
        choices=KERNEL_CHOICES,
        default="auto",
        help="block kernel of TokenRing and the single process (default auto)",
    )
    p.add_argument(
        "--methods",
        type=_methods,
        default=METHOD_CHOICES,
        help=f"comma list of {','.join(METHOD_CHOICES)} (default all)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random q/k/v (0)")
    p.add_argument(
        "--timeout",
        type=positive_seconds,
        default=600.0,
        help="seconds before all workers are killed (default 600)",
    )
    p.add_argument("--json", metavar="PATH", default=None, help="also write the results as JSON")
    p.add_argument("--no-progress", action="store_true", help="no live progress display")
    p.add_argument(
        "--verbose", action="store_true", help="every frame of a failing rank's traceback"
    )


def _ranks(n: int) -> str:
    return "1 rank" if n == 1 else f"{n} ranks"


def resolve(args: argparse.Namespace, gpus: int | None = None):
    """Fill in the "auto" settings; returns (config, nproc, note). A bad combination raises
    ValueError before torch loads (`gpus` None: counted only when a setting depends on it)."""
    count = functools.cache(gpu_count) if gpus is None else (lambda: gpus)
    nproc = args.nproc if args.nproc is not None else max(2, count())
    note = ""
    device = args.device
    if device == "auto":
        device = "cuda" if count() >= nproc else "cpu"
        if count() and device == "cpu":
            note = (
                f"{count()} GPU(s) for {_ranks(nproc)}: running on CPU (--nproc {count()} to "
                "use them)"
            )
    if device == "cuda" and count() < nproc:
        raise ValueError(f"--device cuda needs one GPU per rank: {_ranks(nproc)}, {count()} GPU(s)")
    tokens = args.tokens if args.tokens is not None else DEFAULT_TOKENS[device]
    if tokens % nproc:
        raise ValueError(f"--tokens {tokens} must be a multiple of --nproc {nproc}")
    if device == "cpu" and args.kernel not in CPU_KERNELS:
        raise ValueError(
            f"--kernel {args.kernel} has no CPU version; on CPU use one of {', '.join(CPU_KERNELS)}"
        )
    dtype = DEFAULT_DTYPE[device] if args.dtype == "auto" else args.dtype
    from .demo import DemoConfig  # torch: only once the arguments are known to be good

    cfg = DemoConfig(
        device=device,
        tokens=tokens,
        heads=args.heads,
        head_size=args.head_size,
        batch=args.batch,
        dtype=dtype,
        iters=args.iters,
        warmup=args.warmup,
        kernel=args.kernel,
        methods=tuple(args.methods),
        seed=args.seed,
    )
    return cfg, nproc, note


def run(args: argparse.Namespace) -> int:
    """`tokenring-xdit demo`: exit code 0 within tolerance, 1 above it, 2 bad arguments, 3 a
    worker failed."""
    try:
        cfg, nproc, note = resolve(args)
    except ValueError as exc:
        print_usage_error("demo", exc)
        return EXIT_USAGE
    from rich.console import Console

    console = Console()
    err = Console(stderr=True)
    if note:
        console.print(f"[yellow]note:[/] {note}")
    console.print(
        f"[bold]tokenring-xdit demo[/]: {_ranks(nproc)} on {cfg.device}"
        f" ({'NCCL' if cfg.device == 'cuda' else 'gloo'}), batch {cfg.batch}, {cfg.tokens} tokens,"
        f" {cfg.heads} heads x {cfg.head_size}, {cfg.dtype}, {cfg.iters} timed calls"
        f" after {cfg.warmup} warm-up"
    )
    from .launch import LaunchError

    try:
        summary = _launch_with_progress(cfg, nproc, args.timeout, console, args.no_progress)
    except LaunchError as exc:
        print_failure(err, exc, verbose=args.verbose)
        return EXIT_WORKER
    failed = _print_table(console, summary)
    if args.json:
        summary["passed"] = not failed
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=2)
        console.print(f"results written to {args.json}")
    if failed:
        err.print(
            f"[bold red]error above tolerance[/] ({summary['tolerance']:g}): " + ", ".join(failed)
        )
        return EXIT_INACCURATE
    return EXIT_OK


def _launch_with_progress(cfg, nproc: int, timeout: float, console, quiet: bool) -> dict:
    from .demo import run_demo
    from .launch import launch

    progress = rank_progress("rank {task.fields[rank]}", console, quiet)
    tasks = [progress.add_task("starting", total=None, rank=r) for r in range(nproc)]

    def on_progress(rank: int, fields: dict) -> None:
        progress.update(tasks[rank], **fields)

    with progress:
        values = launch(
            run_demo, nproc, (cfg,), device=cfg.device, timeout=timeout, on_progress=on_progress
        )
    return values[0]


def _print_table(console, summary: dict) -> list[str]:
    """Print the results; return the labels of methods whose output error is above tolerance."""
    from rich import box
    from rich.table import Table

    tol = summary["tolerance"]
    single = next((r["ms_per_call"] for r in summary["results"] if r["method"] == "single"), None)
    env = summary["environment"]
    table = Table(
        title="attention: TokenRing vs yunchang ring vs exact",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        collapse_padding=True,
        title_justify="left",
        caption_justify="left",
        caption=f"err = max |error| vs fp64 exact attention; ok = err out <= {tol:g}; "
        f"ms/call = slowest rank; speed-up vs the single process; torch {env['torch']}, "
        f"{env['backend']}, "
        f"{env.get('gpu', str(env['threads_per_rank']) + ' CPU thread(s) per rank')}",
    )
    for col, justify in (
        ("method", "left"),
        ("kernel", "left"),
        ("ranks", "right"),
        ("ms/call", "right"),
        ("speed-up", "right"),
        ("err out", "right"),
        ("err lse", "right"),
        ("ok", "center"),
    ):
        table.add_column(col, justify=justify, no_wrap=True)
    failed = []
    for r in summary["results"]:
        # The output decides; lse is shown for information: yunchang's torch kernels round the
        # block lse to the input dtype (about 0.03 at bf16), which the output barely feels.
        ok = r["max_err_out"] <= tol
        if not ok:
            failed.append(r["label"])
        speedup = f"{single / r['ms_per_call']:.2f}x" if single else "-"
        table.add_row(
            r["label"],
            r["kernel"],
            str(r["ranks"]),
            f"{r['ms_per_call']:.3f}",
            speedup,
            f"{r['max_err_out']:.2e}",
            f"{r['max_err_lse']:.2e}",
            "[green]yes[/]" if ok else "[bold red]NO[/]",
        )
    console.print(table)
    return failed
