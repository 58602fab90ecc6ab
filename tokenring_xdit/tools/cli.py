"""`tokenring-xdit`: argument parsing and subcommands only.

With no subcommand it runs `compare`: one image made by plain diffusers, by xDiT with its own ring
and by xDiT with TokenRing (or, with `--host diffusers`, by diffusers' context parallelism with its
ring and with TokenRing), compared pixel by pixel (CPU processes over gloo, or one GPU per rank
over NCCL). `demo` times the attention alone. Importing this module is cheap: torch, rich and the
workers load inside the subcommand that needs them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence

from .. import __version__
from .cli_args import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_WORKER,
    add_device_and_dtype,
    non_negative_int,
    positive_int,
    print_failure,
    rank_progress,
)

__all__ = ["main", "build_parser"]

# Kept in sync with tokenring_xdit.ring.kernels.KERNELS by tests/unit/test_cli.py (no torch here).
KERNEL_CHOICES = (
    "auto",
    "flash_attn",
    "cudnn",
    "torch_flash",
    "torch_efficient",
    "cpu_flash",
    "math",
)
METHOD_CHOICES = ("single", "tokenring", "yunchang")
DEFAULT_TOKENS = {"cpu": 1024, "cuda": 4096}
DEFAULT_DTYPE = {"cpu": "float32", "cuda": "bfloat16"}
CPU_KERNELS = ("auto", "cpu_flash", "math")

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


def _add_demo_args(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--heads", type=positive_int, default=16, help="attention heads (default 16)")
    p.add_argument(
        "--head-size",
        type=positive_int,
        default=72,
        help="head size (default 72: PixArt-alpha's 16x72)",
    )
    p.add_argument("--batch", type=positive_int, default=1, help="batch size (default 1)")
    p.add_argument("--iters", type=positive_int, default=20, help="timed calls per method (20)")
    p.add_argument(
        "--warmup",
        type=non_negative_int,
        default=5,
        help="untimed calls per method before timing (5)",
    )
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
        type=float,
        default=600.0,
        help="seconds before all workers are killed (default 600)",
    )
    p.add_argument("--json", metavar="PATH", default=None, help="also write the results as JSON")
    p.add_argument("--no-progress", action="store_true", help="no live progress display")


# (name, help, add_arguments, run). Add a subcommand here; the first one is the default.
SUBCOMMANDS: list[tuple[str, str, Callable[[argparse.ArgumentParser], None], Callable]] = []


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (exit 2) instead of the full usage block."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tokenring-xdit",
        description="TokenRing attention for yunchang/xDiT. Without a subcommand: `compare`.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text, add_arguments, run in SUBCOMMANDS:
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
        p.set_defaults(run=run)
    return parser


def _unknown_command(word: str, names: list[str]) -> str:
    import difflib

    near = difflib.get_close_matches(word, names, n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    return f"unknown command {word!r}: {hint}choose from {', '.join(names)}"


def main(argv: Sequence[str] | None = None) -> int:
    """The console script. A reader that closes the pipe early (`... | head`) ends it quietly."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit flush
        return code
    except BrokenPipeError:
        # stdout is gone: point it at /dev/null so that exit's own flush cannot fail again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = [name for name, *_ in SUBCOMMANDS]
    parser = build_parser()
    if argv and not argv[0].startswith("-") and argv[0] not in names:
        # compare takes no positional argument: a bare word is a mistyped command
        parser.error(_unknown_command(argv[0], names))
    if not argv or argv[0] not in (*names, "-h", "--help", "--version"):
        argv = [SUBCOMMANDS[0][0], *argv]  # `tokenring-xdit --steps 4` = `... compare --steps 4`
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the subcommand's parser, which points at its own --help
        _subparser(parser, args.command).error(f"unrecognized arguments: {' '.join(extra)}")
    return args.run(args)


def _subparser(parser: argparse.ArgumentParser, name: str | None) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    return parser


# ---------------------------------------------------------------------------------------- demo


def _ranks(n: int) -> str:
    return "1 rank" if n == 1 else f"{n} ranks"


def _resolve(args: argparse.Namespace):
    """Fill in the "auto" settings (this imports torch); returns (config, nproc, note)."""
    import torch

    from .demo import DemoConfig

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nproc = args.nproc if args.nproc is not None else max(2, gpus)
    note = ""
    device = args.device
    if device == "auto":
        device = "cuda" if gpus >= nproc else "cpu"
        if gpus and device == "cpu":
            note = f"{gpus} GPU(s) for {_ranks(nproc)}: running on CPU (--nproc {gpus} to use them)"
    if device == "cuda" and gpus < nproc:
        raise ValueError(f"--device cuda needs one GPU per rank: {_ranks(nproc)}, {gpus} GPU(s)")
    tokens = args.tokens if args.tokens is not None else DEFAULT_TOKENS[device]
    if tokens % nproc:
        raise ValueError(f"--tokens {tokens} must be a multiple of --nproc {nproc}")
    if device == "cpu" and args.kernel not in CPU_KERNELS:
        raise ValueError(
            f"--kernel {args.kernel} has no CPU version; on CPU use one of {', '.join(CPU_KERNELS)}"
        )
    dtype = DEFAULT_DTYPE[device] if args.dtype == "auto" else args.dtype
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


def _run_demo(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    err = Console(stderr=True)
    try:
        cfg, nproc, note = _resolve(args)
    except ValueError as exc:
        err.print(f"[bold red]error:[/] {exc}")
        return EXIT_USAGE
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
        print_failure(err, exc)
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


SUBCOMMANDS.append(
    (
        "demo",
        "time TokenRing, yunchang's ring and exact attention on local ranks (random tensors)",
        _add_demo_args,
        _run_demo,
    )
)

# ------------------------------------------------------------------------------------- patches


def _add_patches_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--markdown", action="store_true", help="print the audit table (patches/README.md)"
    )


def _run_patches(args: argparse.Namespace) -> int:
    from ..patches.audit import to_lines, to_markdown

    sys.stdout.write(to_markdown() if args.markdown else "\n".join(to_lines()) + "\n")
    return 0


SUBCOMMANDS.append(
    (
        "patches",
        "list every place tokenring_xdit patches a host library (--markdown: the audit file)",
        _add_patches_args,
        _run_patches,
    )
)

# ---------------------------------------------------------------------------------------- plan


def _add_plan_args(parser: argparse.ArgumentParser) -> None:
    from ..planner import cli as planner_cli  # cheap: numpy/scipy load when it runs

    planner_cli.add_arguments(parser)


def _run_plan(args: argparse.Namespace) -> int:
    from ..planner import cli as planner_cli

    return planner_cli.run(args)


SUBCOMMANDS.append(
    (
        "plan",
        "predict and rank ulysses x ring splits and ring implementations for a model, sequence "
        "and machine (cost model; --validate checks it against docs/benchmarks/)",
        _add_plan_args,
        _run_plan,
    )
)

# ------------------------------------------------------------------------------------- compare


def _add_compare_args(parser: argparse.ArgumentParser) -> None:
    from .compare import add_arguments  # a cheap module: its heavy imports are inside functions

    add_arguments(parser)


def _run_compare(args: argparse.Namespace) -> int:
    from .compare import run_cli

    return run_cli(args)


# The first entry is the default subcommand.
SUBCOMMANDS.insert(
    0,
    (
        "compare",
        "one image three ways (diffusers in 1 process, xDiT's ring, xDiT + TokenRing; with "
        "--host diffusers: diffusers' context-parallel ring and TokenRing): images, difference "
        "maps, PSNR/SSIM report (random-weight PixArt or Flux)",
        _add_compare_args,
        _run_compare,
    ),
)


if __name__ == "__main__":
    sys.exit(main())
