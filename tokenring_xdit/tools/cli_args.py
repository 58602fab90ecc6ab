"""Command-line pieces shared by `tokenring-xdit demo` and `tokenring-xdit compare`.

argparse only at import time (the CLI builds its parser on every start); rich loads inside
`rank_progress`. Usage errors are found and printed before torch or rich load: on a busy machine
importing torch takes tens of seconds, too long to wait for "--tokens 1001 is not a multiple".
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


# Exit codes of every subcommand: 0 passed, 1 a result missed its threshold, 2 bad arguments
# (argparse's own), 3 a worker failed or timed out.
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_WORKER = 0, 1, 2, 3


TRACE_FRAMES = 6  # the innermost frames shown of a failing rank's traceback (--verbose: all)


def print_failure(err, exc, verbose: bool = False) -> None:
    """A LaunchError for the user: where the first failure happened (its innermost frames; all
    of them with `verbose`), then one line per failing rank. Lines are never re-wrapped (a
    terminal or a log file wraps them itself)."""
    traced = [f for f in exc.failures if f.trace]
    hint = ""
    if traced and not verbose and _raised_by_us(traced[0].trace):
        traced = []  # our message names the cause and the fix: the frames only with --verbose
        hint = " (--verbose shows the traceback)"
    if traced:
        trace = traced[0].trace.rstrip()
        if not verbose:
            trace = _last_frames(trace, TRACE_FRAMES)
        err.print(f"rank {traced[0].rank}: {trace}", markup=False, highlight=False, soft_wrap=True)
    err.print(
        f"[bold red]worker failure:[/] {len(exc.failures)} rank(s) failed{hint}", soft_wrap=True
    )
    for failure in exc.failures:
        err.print(f"  {failure}", markup=False, highlight=False, soft_wrap=True)


def _raised_by_us(trace: str) -> bool:
    """Whether a formatted traceback's innermost frame is a file of tokenring_xdit."""
    from pathlib import Path

    files = re.findall(r'^  File "([^"]+)"', trace, flags=re.MULTILINE)
    package = Path(__file__).resolve().parents[1]
    return bool(files) and Path(files[-1]).resolve().is_relative_to(package)


def _last_frames(trace: str, n: int) -> str:
    """A formatted traceback cut to its last n frames ("  File ..." blocks), saying so."""
    lines = trace.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    if len(starts) <= n:
        return trace
    cut = starts[-n]
    return "\n".join(
        [lines[0], f"  ... {len(starts) - n} outer frames left out (--verbose shows them)"]
        + lines[cut:]
    )


def usage_error_line(command: str, message: str) -> str:
    """Every subcommand's usage errors in argparse's form (cli._Parser gives argparse's own
    the same ending): `tokenring-xdit COMMAND: error: ... (see tokenring-xdit COMMAND --help)`."""
    prog = f"tokenring-xdit {command}"
    return f"{prog}: error: {message} (see {prog} --help)"


def print_usage_error(command: str, exc: Exception | str) -> None:
    """A usage error found after parsing (e.g. a bad combination): one line on stderr, written
    directly (rich need not load for it)."""
    sys.stderr.write(usage_error_line(command, str(exc)) + "\n")


# Where none of these exists no GPU driver is loaded, so torch would find no GPU; asking torch
# costs its import, which on a busy machine delays a usage error by tens of seconds.
_GPU_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd")


def gpu_count() -> int:
    """The GPUs torch can use; 0 without importing torch on a Linux machine with no GPU driver."""
    if sys.platform == "linux" and not any(map(os.path.exists, _GPU_DRIVER_PATHS)):
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def positive_number(unit: str = "") -> Callable[[str], float]:
    """An argparse type: a finite number > 0, e.g. of `unit` "seconds" (a timeout)."""
    what = f"number of {unit}" if unit else "number"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {what}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be a finite {what} > 0, got {text}")
        return value

    return parse


positive_seconds = positive_number("seconds")


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= low, with a readable error otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


positive_int, non_negative_int = int_at_least(1), int_at_least(0)


def add_device_and_dtype(p: argparse.ArgumentParser) -> None:
    """--device {auto,cpu,cuda} and --dtype, resolved by each subcommand."""
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto = one GPU per rank when enough GPUs exist, else CPU (default auto)",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default="auto",
        help="auto = float32 on CPU, bfloat16 on GPU",
    )


def rank_progress(label: str, console, quiet: bool):
    """A transient rich progress display, one task per run or rank; `label` formats the first
    column from the task's fields (e.g. "rank {task.fields[rank]}")."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=quiet,
    )
