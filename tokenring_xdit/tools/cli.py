"""`tokenring-xdit`: argument parsing and subcommands only.

With no subcommand it runs `compare`: one image made by plain diffusers, by xDiT with its own ring
and by xDiT with TokenRing (or, with `--host diffusers`, by diffusers' context parallelism with its
ring and with TokenRing), compared pixel by pixel (CPU processes over gloo, or one GPU per rank
over NCCL). `demo` times the attention alone. Importing this module is cheap: torch, rich and the
workers load inside the subcommand that needs them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from .. import __version__
from .cli_args import EXIT_OK, EXIT_USAGE

__all__ = ["main", "console_main", "build_parser"]


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
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM (launch.Terminated): ranks stopped
        sys.stderr.write("tokenring-xdit: interrupted\n")
        return getattr(exc, "exit_code", 128 + 2)
    except BrokenPipeError:
        # stdout is gone: point it at /dev/null so that exit's own flush cannot fail again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


def console_main(argv: Sequence[str] | None = None) -> NoReturn:
    """The console script and `python -m`: main(), then the exit without the interpreter's
    teardown of the modules a subcommand loaded (torch, numpy, rich: 0.7-1.7 s after the last
    line on a busy 2-core machine); exit handlers still run."""
    from .rank_exit import exit_without_teardown

    exit_without_teardown(main(argv))


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


def _lazy(module: str, run: str = "run") -> tuple[Callable, Callable]:
    """(add_arguments, run) of a subcommand whose module loads only when its parser is built
    (argparse-only at import: torch, numpy, rich load when it runs)."""
    import importlib

    def load():
        return importlib.import_module(module, __package__)

    return (
        lambda parser: load().add_arguments(parser),
        lambda args: getattr(load(), run)(args),
    )


def _add_patches_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--markdown", action="store_true", help="print the audit table (patches/README.md)"
    )


def _run_patches(args: argparse.Namespace) -> int:
    from ..patches.audit import to_lines, to_markdown

    sys.stdout.write(to_markdown() if args.markdown else "\n".join(to_lines()) + "\n")
    return 0


# (name, help, add_arguments, run). Add a subcommand here; the first one is the default.
SUBCOMMANDS: list[tuple[str, str, Callable[[argparse.ArgumentParser], None], Callable]] = [
    (
        "compare",
        "one image three ways (diffusers in 1 process, xDiT's ring, xDiT + TokenRing; with "
        "--host diffusers: diffusers' context-parallel ring and TokenRing): images, difference "
        "maps, PSNR/SSIM report (random-weight PixArt or Flux)",
        *_lazy(".compare", run="run_cli"),
    ),
    (
        "demo",
        "time TokenRing, yunchang's ring and exact attention on local ranks (random tensors)",
        *_lazy(".demo_cli"),
    ),
    (
        "patches",
        "list every place tokenring_xdit patches a host library (--markdown: the audit file)",
        _add_patches_args,
        _run_patches,
    ),
    (
        "plan",
        "predict and rank ulysses x ring splits and ring implementations for a model, sequence "
        "and machine (cost model; --validate checks it against docs/benchmarks/)",
        *_lazy(".plan_cli"),
    ),
]


if __name__ == "__main__":
    console_main()
