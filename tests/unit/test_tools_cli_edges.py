"""The command-line edges a newcomer hit: closed pipes, argument validation with
one-line errors, mistyped subcommands, `plan --validate` outside the checkout, a GPU without a
kernel table, and one wording of the planner's pick score everywhere."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.speed import scaled
from tokenring_xdit.planner.validate import SWEEPS_DIR, default_bench_dir, validate
from tokenring_xdit.tools import cli

ROOT = Path(__file__).resolve().parents[2]


def _exit(argv, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    got = capsys.readouterr()
    return info.value.code, got.out, got.err


def _cli(*argv: str, cwd: Path | None = None, env: dict | None = None, **kw):
    return subprocess.run(
        [sys.executable, "-m", "tokenring_xdit.tools.cli", *argv],
        cwd=cwd,
        env=env,
        text=True,
        timeout=scaled(120),
        **kw,
    )


# ------------------------------------------------------------------------------ closed pipe


@pytest.mark.parametrize("argv", [["patches"], ["plan", "--model", "flux", "--tokens", "4096"]])
def test_a_closed_pipe_ends_quietly(argv):
    """`tokenring-xdit patches | head`: the reader is gone before the first write."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenring_xdit.tools.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()  # before the child has started up, so its writes meet EPIPE
    err = proc.stderr.read()
    assert proc.wait(timeout=scaled(120)) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


# --------------------------------------------------------------------- argument validation


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tokens", "-5"], "argument --tokens: must be >= 1, got -5"),
        (["--tokens", "0"], "argument --tokens: must be >= 1, got 0"),
        (["--top", "-1"], "argument --top: must be >= 1, got -1"),
        (["--top", "0"], "argument --top: must be >= 1, got 0"),
        (["--gpus", "0"], "argument --gpus: must be >= 1, got 0"),
        (["--resolution", "-16"], "argument --resolution: must be >= 1"),
        (["--tokens", "x"], "argument --tokens: 'x' is not an integer"),
    ],
)
def test_plan_refuses_bad_numbers_in_one_line(argv, message, capsys):
    code, out, err = _exit(["plan", "--model", "flux", *argv], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err and "plan --help" in err, err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tokens", "1", "--gpus", "2"], "leaves some of the 2 GPUs without a token"),
        (["--resolution", "8"], "below one 16 px patch"),
        (["--gpus", "3", "--nodes", "2", "--tokens", "96"], "positive multiple of --nodes"),
    ],
)
def test_plan_refuses_impossible_shapes_in_one_line(argv, message, capsys):
    assert cli.main(["plan", "--model", "flux", *argv]) == 2
    got = capsys.readouterr()
    assert got.out == "" and got.err.count("\n") == 1 and message in got.err, got.err


def test_plan_top_prints_that_many_rows_and_all_without_it(capsys):
    assert cli.main(["plan", "--model", "flux", "--tokens", "16896", "--gpus", "4"]) == 0
    every = re.findall(r"^ *\d+ ulysses", capsys.readouterr().out, flags=re.M)
    assert (
        cli.main(["plan", "--model", "flux", "--tokens", "16896", "--gpus", "4", "--top", "1"]) == 0
    )
    assert len(re.findall(r"^ *\d+ ulysses", capsys.readouterr().out, flags=re.M)) == 1
    assert len(every) > 3


# --------------------------------------------------------------------------- subcommands


@pytest.mark.parametrize(
    "word, hint", [("plna", "did you mean 'plan'?"), ("comapre", "did you mean 'compare'?")]
)
def test_a_mistyped_subcommand_is_named(word, hint, capsys):
    code, out, err = _exit([word], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"unknown command {word!r}" in err and hint in err
    assert "compare, demo, patches, plan" in err


def test_an_unknown_word_gets_no_guess(capsys):
    code, _, err = _exit(["xyzzy", "--steps", "2"], capsys)
    assert code == 2 and "unknown command 'xyzzy'" in err and "did you mean" not in err


# ---------------------------------------------------------------------- the kernel table


def test_a_gpu_without_its_kernel_table_is_warned_about(capsys):
    argv = ["plan", "--model", "flux", "--tokens", "4096", "--gpu", "NVIDIA A100", "--top", "1"]
    assert cli.main(argv) == 0
    got = capsys.readouterr()
    assert "warning: no kernel table for 'NVIDIA A100'" in got.err
    assert "NVIDIA H200's: none for NVIDIA A100" in got.out  # on the machine line, too
    assert cli.main(["plan", "--model", "flux", "--tokens", "4096", "--gpu", "NVIDIA H100"]) == 0
    assert "warning" not in capsys.readouterr().err  # a shipped table: no warning


# ------------------------------------------------------------------------- plan --validate


def test_validate_defaults_to_the_checkout_then_the_shipped_copy(tmp_path):
    assert default_bench_dir() == ROOT / SWEEPS_DIR
    installed = tmp_path / "site" / "tokenring_xdit"
    sweeps = installed / "planner" / "data" / "sweeps"
    sweeps.mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="pass --bench-dir"):
        default_bench_dir(installed)
    (sweeps / "sweep_x.json").write_text("{}")
    assert default_bench_dir(installed) == sweeps


def test_validate_of_an_empty_folder_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["plan", "--validate", "--bench-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no sweep_*.json rows under {tmp_path}" in err


def test_validate_runs_from_a_built_wheel_outside_the_checkout(tmp_path):
    """Build the wheel (hatch_build.py adds the sweeps), unpack it as an installed copy and run
    `plan --validate` from elsewhere: it must find the sweeps it ships."""
    pytest.importorskip("hatchling", reason="the test extra installs hatchling")
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(dist)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=scaled(300),
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = dist.glob("tokenring_xdit-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        zf.extractall(site)
    shipped = sorted(n for n in names if n.startswith("tokenring_xdit/planner/data/sweeps/"))
    committed = sorted((ROOT / SWEEPS_DIR).glob("sweep_*.json"))
    assert [Path(n).name for n in shipped] == [p.name for p in committed]
    assert "tokenring_xdit/planner/derive.py" not in names  # the development tool stays out
    env = {**os.environ, "PYTHONPATH": str(site), "TOKENRING_XDIT_AUTOPATCH": "0"}
    done = _cli("plan", "--validate", cwd=tmp_path, env=env, capture_output=True)
    assert done.returncode == 0, done.stderr
    assert f"files in {site / 'tokenring_xdit' / 'planner' / 'data' / 'sweeps'}" in done.stdout


def test_validate_wording_is_the_readme_and_planner_docs_wording(capsys):
    checks, picks = validate()
    right, rows = sum(p[3] for p in picks), len(picks)
    exact = sum(p[4] for p in picks)
    assert cli.main(["plan", "--validate"]) == 0
    out = capsys.readouterr().out
    phrase = f"best pick right in {right} of {rows}"
    assert out.strip().splitlines()[-1].endswith(f"{phrase} (within 5% of the measured best)")
    assert f"in {right} of {rows} rows; the measured best itself in {exact}" in out
    for doc in ("README.md", "docs/planner.md"):
        text = " ".join((ROOT / doc).read_text().split())
        assert phrase in text, f"{doc} should say '{phrase}'"
        assert "exactly right" not in text  # one meaning of "right": within 5 % of the best


# ------------------------------------------------------------------- plot, one rank


def test_plan_plot_without_matplotlib_fails_before_the_table():
    code = (
        "import sys; sys.modules['matplotlib'] = None  # as if not installed\n"
        "from tokenring_xdit.tools import cli\n"
        "sys.exit(cli.main(['plan', '--model', 'flux', '--tokens', '4096', '--plot', 'x.png']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=scaled(120)
    )
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == "", done.stdout  # no table first
    assert "--plot needs matplotlib" in done.stderr and "Traceback" not in done.stderr


def test_one_rank_is_singular():
    from tokenring_xdit.tools import demo_cli

    assert demo_cli._ranks(1) == "1 rank" and demo_cli._ranks(2) == "2 ranks"


def test_the_examples_output_dir_is_git_ignored():
    """The examples write images to --output_dir (default results/): never committed by accident."""
    defaults = re.findall(r'"--output_dir", default="([^"]+)"', "".join(
        p.read_text() for p in (ROOT / "examples").glob("*.py")))  # fmt: skip
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert defaults and all(f"{d}/" in ignored for d in defaults), (defaults, ignored)


# ------------------------------------------------------------- compare's failures


def test_an_unknown_option_of_a_subcommand_points_at_its_help(capsys):
    code, out, err = _exit(["compare", "--bogus"], capsys)
    assert code == 2 and out == ""
    assert err == (
        "tokenring-xdit compare: error: unrecognized arguments: --bogus "
        "(see tokenring-xdit compare --help)\n"
    ), err


def test_a_bad_compare_value_is_one_prefixed_line(capsys):
    assert cli.main(["compare", "--ring-degree", "1", "--device", "cpu"]) == 2
    got = capsys.readouterr()
    assert got.out == "" and got.err.count("\n") == 1, got.err
    assert got.err.startswith("tokenring-xdit compare: error: --ring-degree must be at least 2")
    assert got.err.rstrip().endswith("(see tokenring-xdit compare --help)"), got.err


def test_a_rank_failure_prints_its_innermost_frames_unwrapped():
    import io

    from rich.console import Console

    from tokenring_xdit.tools.cli_args import TRACE_FRAMES, print_failure
    from tokenring_xdit.tools.launch import LaunchError, RankFailure

    frames = "".join(f'  File "/a/very/long/path/{"x" * 90}/m{i}.py", line {i}, in f{i}\n'
                     f"    call_{i}()\n" for i in range(40))  # fmt: skip
    message = "word " * 100  # 500 characters: the summary is cut at a word
    failure = RankFailure(
        1, "RuntimeError", message, f"Traceback (most recent call last):\n{frames}"
    )
    for verbose, shown in ((False, TRACE_FRAMES), (True, 40)):
        out = io.StringIO()
        print_failure(Console(file=out, width=80), LaunchError("x", [failure]), verbose=verbose)
        text = out.getvalue()
        assert text.count('  File "') == shown, text
        assert all(f"m{i}.py" in text for i in range(40 - shown, 40)), text
        assert f'/m{39}.py", line 39' in text  # a 120-column line kept whole (no re-wrapping)
        summary = [line for line in text.splitlines() if line.startswith("  rank 1:")]
        assert summary and summary[0].endswith("word ..."), summary
    assert "34 outer frames left out (--verbose shows them)" in text or verbose


# ---------------------------------------------- demo's prefix, a zero timeout


def test_a_bad_demo_value_is_one_prefixed_line(capsys):
    assert cli.main(["demo", "--device", "cpu", "--tokens", "7"]) == 2
    got = capsys.readouterr()
    assert got.out == "" and got.err.count("\n") == 1, got.err
    assert got.err.startswith("tokenring-xdit demo: error: --tokens 7 must be a multiple"), got
    assert got.err.rstrip().endswith("(see tokenring-xdit demo --help)"), got.err


@pytest.mark.parametrize("command", ["compare", "demo"])
@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "soon"])
def test_a_timeout_that_cannot_run_is_a_usage_error(command, value, capsys):
    code, out, err = _exit([command, "--timeout", value], capsys)
    assert code == 2 and out == "", err
    assert err.startswith(f"tokenring-xdit {command}: error: argument --timeout"), err


def test_our_own_rank_error_is_its_lines_without_frames():
    import io

    from rich.console import Console

    import tokenring_xdit.config as ours
    from tokenring_xdit.tools.cli_args import print_failure
    from tokenring_xdit.tools.launch import LaunchError, RankFailure

    trace = f'Traceback (most recent call last):\n  File "{ours.__file__}", line 1, in f\n    x()\n'
    failures = [RankFailure(r, "ValueError", "TOKENRING_XDIT_TIMEOUT='abc': use ...", trace)
                for r in (1, 0)]  # fmt: skip
    for verbose in (False, True):
        out = io.StringIO()
        print_failure(Console(file=out, width=200), LaunchError("x", failures), verbose=verbose)
        lines = out.getvalue().splitlines()
        if verbose:
            assert any(ours.__file__ in line for line in lines), lines
        else:
            assert lines == [
                "worker failure: 2 rank(s) failed (--verbose shows the traceback)",
                "  rank 1: ValueError: TOKENRING_XDIT_TIMEOUT='abc': use ...",
                "  rank 0: ValueError: TOKENRING_XDIT_TIMEOUT='abc': use ...",
            ], lines
