"""`tokenring-xdit` argument parsing, help, exit codes and the results table (no ranks started)."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from tests.speed import scaled
from tokenring_xdit import __version__
from tokenring_xdit.tools import cli, demo_cli


def _exit_code(argv, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    out = capsys.readouterr()
    return info.value.code, out.out, out.err


def test_version(capsys):
    code, out, _ = _exit_code(["--version"], capsys)
    assert code == 0 and out.strip() == f"tokenring-xdit {__version__}"


def test_help_lists_subcommands(capsys):
    code, out, _ = _exit_code(["--help"], capsys)
    assert code == 0 and "compare" in out and "demo" in out and "patches" in out
    assert "Without a subcommand: `compare`" in out


def test_compare_is_the_default_subcommand():
    assert cli.SUBCOMMANDS[0][0] == "compare"
    assert [name for name, *_ in cli.SUBCOMMANDS] == ["compare", "demo", "patches", "plan"]


def test_compare_help_lists_options(capsys):
    code, out, _ = _exit_code(["compare", "--help"], capsys)
    assert code == 0
    for flag in (
        "--model",
        "--size",
        "--nproc",
        "--ulysses-degree",
        "--ring-degree",
        "--steps",
        "--height",
        "--width",
        "--seed",
        "--out",
        "--device",
        "--psnr-min",
        "--max-diff",
    ):
        assert flag in out


def test_demo_help_lists_options(capsys):
    code, out, _ = _exit_code(["demo", "--help"], capsys)
    assert code == 0
    for flag in (
        "--nproc",
        "--device",
        "--tokens",
        "--heads",
        "--head-size",
        "--batch",
        "--dtype",
        "--iters",
        "--warmup",
        "--json",
    ):
        assert flag in out


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "--iters", "0"],
        ["demo", "--nproc", "two"],
        ["demo", "--device", "tpu"],
        ["demo", "--dtype", "int8"],
        ["demo", "--methods", "tokenring,nope"],
        ["demo", "--kernel", "nope"],
        ["demo", "--warmup", "-1"],
        ["--bogus"],
        ["demo", "extra"],
    ],
)
def test_bad_arguments_exit_2(argv, capsys):
    code, _, err = _exit_code(argv, capsys)
    assert code == 2 and "error" in err


def test_defaults():
    args = cli.build_parser().parse_args(["demo"])
    assert (args.nproc, args.device, args.tokens, args.dtype) == (None, "auto", None, "auto")
    assert (args.heads, args.head_size, args.batch) == (16, 72, 1)
    assert args.methods == ("single", "tokenring", "yunchang") and args.json is None


def _record_runs(monkeypatch) -> list:
    seen = []
    subcommands = [
        (n, h, add, lambda args: seen.append(args) or 0) for n, h, add, _ in cli.SUBCOMMANDS
    ]
    monkeypatch.setattr(cli, "SUBCOMMANDS", subcommands)
    return seen


@pytest.mark.parametrize("argv", [[], ["--steps", "4"], ["--no-progress"], ["--model", "flux"]])
def test_no_subcommand_runs_compare(argv, monkeypatch):
    seen = _record_runs(monkeypatch)
    assert cli.main(argv) == 0
    assert len(seen) == 1 and seen[0].command == "compare"


@pytest.mark.parametrize("argv", [["demo"], ["demo", "--tokens", "512"], ["patches"]])
def test_named_subcommands_still_run(argv, monkeypatch):
    seen = _record_runs(monkeypatch)
    assert cli.main(argv) == 0
    assert len(seen) == 1 and seen[0].command == argv[0]


def test_demo_options_need_the_demo_subcommand(capsys):
    """Bare options go to the default subcommand, now compare, which has no --tokens."""
    code, _, err = _exit_code(["--tokens", "512"], capsys)
    assert code == 2 and "--tokens" in err


def test_methods_deduplicated():
    args = cli.build_parser().parse_args(["demo", "--methods", "tokenring, yunchang,tokenring"])
    assert args.methods == ("tokenring", "yunchang")


def test_kernel_choices_are_the_registry_names():
    """The CLI's choices derive from the registry's names, and say which run on a CPU."""
    from tokenring_xdit.ring.kernels import KERNELS
    from tokenring_xdit.ring.kernels.names import KernelName

    assert demo_cli.KERNEL_CHOICES == ("auto", *KERNELS)
    on_cpu = {n for n in KERNELS if "cpu" in KernelName(n).devices}
    assert set(demo_cli.CPU_KERNELS) == {"auto", *on_cpu} == {"auto", "cpu_flash", "math"}


def _resolve(argv):
    return demo_cli.resolve(cli.build_parser().parse_args(["demo", *argv]))


def test_resolve_cpu_defaults():
    import torch

    if torch.cuda.is_available():
        pytest.skip("defaults differ with GPUs")
    cfg, nproc, note = _resolve([])
    assert nproc == 2 and note == ""
    assert (cfg.device, cfg.tokens, cfg.dtype, cfg.heads, cfg.head_size, cfg.batch) == (
        "cpu",
        1024,
        "float32",
        16,
        72,
        1,
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "cpu", "--tokens", "1001"], "multiple of --nproc"),
        (["--device", "cpu", "--kernel", "cudnn"], "no CPU version"),
    ],
)
def test_resolve_rejects(argv, message):
    with pytest.raises(ValueError, match=message):
        _resolve(argv)


def test_cuda_without_gpus_is_a_usage_error(capsys):
    import torch

    if torch.cuda.device_count() >= 2:
        pytest.skip("has GPUs")
    assert cli.main(["demo", "--device", "cuda"]) == cli.EXIT_USAGE
    assert "one GPU per rank" in capsys.readouterr().err


def test_bad_tokens_exit_2_before_starting_ranks(capsys, monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("ranks started")

    monkeypatch.setattr(demo_cli, "_launch_with_progress", no_launch)
    assert cli.main(["demo", "--device", "cpu", "--tokens", "7"]) == cli.EXIT_USAGE


def _summary(err_out: float) -> dict:
    row = {
        "ms_per_call": 2.0,
        "max_err_out": 1e-7,
        "max_err_lse": 1e-7,
        "ranks": 2,
        "kernel": "cpu_flash",
    }
    return {
        "config": {},
        "world_size": 2,
        "tolerance": 1e-4,
        "environment": {"torch": "x", "backend": "gloo", "threads_per_rank": 1},
        "results": [
            {**row, "method": "single", "label": "single process", "ms_per_call": 4.0, "ranks": 1},
            {**row, "method": "tokenring", "label": "TokenRing", "max_err_out": err_out},
            {**row, "method": "yunchang", "label": "yunchang ring"},
        ],
    }


@pytest.mark.parametrize("err_out, code", [(1e-7, cli.EXIT_OK), (1e-2, demo_cli.EXIT_INACCURATE)])
def test_exit_code_follows_tolerance(err_out, code, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo_cli, "_launch_with_progress", lambda *a, **k: _summary(err_out))
    path = tmp_path / "r.json"
    assert cli.main(["demo", "--device", "cpu", "--json", str(path)]) == code
    out = capsys.readouterr().out
    assert "TokenRing" in out and "yunchang ring" in out and "2.00x" in out
    saved = json.loads(path.read_text())
    assert saved["passed"] is (code == cli.EXIT_OK)


def test_worker_failure_exit_code(monkeypatch, capsys):
    from tokenring_xdit.tools.launch import LaunchError, RankFailure

    def fail(*args, **kwargs):
        raise LaunchError(
            "1 of 2 rank(s) failed", [RankFailure(1, "ValueError", "boom\nmore", "Traceback ...")]
        )

    monkeypatch.setattr(demo_cli, "_launch_with_progress", fail)
    assert cli.main(["demo", "--device", "cpu"]) == demo_cli.EXIT_WORKER
    err = capsys.readouterr().err
    assert "rank 1: ValueError: boom" in err and "more" not in err


def test_lse_error_alone_does_not_fail(monkeypatch):
    summary = _summary(1e-7)
    summary["results"][2]["max_err_lse"] = 0.05  # yunchang's bf16-rounded block lse on GPU
    monkeypatch.setattr(demo_cli, "_launch_with_progress", lambda *a, **k: summary)
    assert cli.main(["demo", "--device", "cpu"]) == cli.EXIT_OK


def test_table_marks_failures():
    from rich.console import Console

    console = Console(file=io.StringIO(), width=120)
    assert demo_cli._print_table(console, _summary(1e-2)) == ["TokenRing"]
    assert "NO" in console.file.getvalue()


def test_import_is_cheap():
    code = (
        "import sys, tokenring_xdit.tools.cli; "
        "heavy = [m for m in ('torch', 'rich', 'yunchang') if m in sys.modules]; "
        "sys.exit(f'imported {heavy}' if heavy else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=scaled(60)
    )
    assert done.returncode == 0, done.stderr


def test_module_entry_point_version():
    done = subprocess.run(
        [sys.executable, "-m", "tokenring_xdit.tools.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert done.returncode == 0 and __version__ in done.stdout
