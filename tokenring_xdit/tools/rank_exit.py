"""How a rank script of ours ends under torchrun: one line per rank for our own errors, and no
seconds-long interpreter teardown after success.

Under torchrun every rank prints its whole traceback (tens of lines each, prefixed `[rankN]:`)
before torchrun's own report, so the one-line cause of a bad setting is buried. An error raised
inside tokenring_xdit (or inside the calling script's own folder, e.g. the examples) already
names its cause and fix: it is printed as `rank N: Type: message` and the rank exits with 1.
Anything raised elsewhere (xDiT, diffusers, torch, ...) keeps its full traceback, and so does
ours with LOG_LEVEL=debug (the variable the examples already pass on to xDiT's logger).

After a successful main() the process ends with `os._exit` once the exit handlers have run
(the process groups are gone, the output flushed): what it skips is the interpreter's
finalisation, tearing down every module torch, diffusers and xDiT loaded, which took 1-4 s per
rank after the last output (measured; torchrun waits for the slowest rank).
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

__all__ = [
    "DEBUG_ENV",
    "exit_without_teardown",
    "one_line_usage_errors",
    "raised_by",
    "run_main",
]

DEBUG_ENV = "LOG_LEVEL"
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def raised_by(exc: BaseException, roots: tuple[Path, ...]) -> bool:
    """Whether the innermost frame of `exc`'s traceback is a file under one of `roots`."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    path = Path(tb.tb_frame.f_code.co_filename).resolve()
    return any(path.is_relative_to(root) for root in roots)


def _debug() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() == "debug"


def _rank() -> str:
    return os.environ.get("RANK", "0")


def run_main(main: Callable[[], object], script: str) -> None:
    """Call `main()`; an Exception raised by tokenring_xdit or under `script`'s folder ends this
    rank with one line on stderr and exit code 1 (the traceback with LOG_LEVEL=debug)."""
    roots = (PACKAGE_DIR, Path(script).resolve().parent)
    try:
        main()
    except Exception as exc:
        if _debug() or not raised_by(exc, roots):
            raise
        first = f"rank {_rank()}: {type(exc).__name__}: {exc}"
        sys.stderr.write(f"{first} ({DEBUG_ENV}=debug shows the traceback)\n")
        sys.stderr.flush()
        _linger_under_torchrun()
        sys.exit(1)
    exit_without_teardown(0)


# Under torchrun the first rank to exit makes the agent stop the others: a rank still loading
# its model when a faster peer hit the same mistake was stopped before saying it (seen once in a
# full test run on 2 busy cores). An erring rank waits this long first, so its peers say theirs.
LINGER_S = 3.0


def _linger_under_torchrun() -> None:
    if "TORCHELASTIC_RUN_ID" in os.environ:
        time.sleep(LINGER_S)


def exit_without_teardown(code: int) -> NoReturn:
    """End the process as a normal exit would, minus the interpreter's finalisation: wait for
    the program's own (non-daemon) threads, run the exit handlers (logging's, torch's, ours:
    they release communicators and the default group), flush stdout/stderr, then `os._exit`.
    Files a program left open are not flushed: call it only where every file was closed."""
    me = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not me and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing left to flush
            pass
    os._exit(code)


def one_line_usage_errors(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make this parser's usage errors one line per rank (`prog: error: ... (see --help)`)
    instead of its whole usage block (xDiT's parser has about 70 lines of it)."""

    def error(message: str) -> NoReturn:
        parser.exit(2, f"rank {_rank()}: {parser.prog}: error: {message} (see --help)\n")

    parser.error = error  # type: ignore[method-assign]  # this instance only
    return parser
