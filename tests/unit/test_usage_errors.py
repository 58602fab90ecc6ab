"""Usage errors as a new user meets them: found before anything heavy loads (on a busy machine
importing torch alone takes tens of seconds), naming the flag the user typed, and one line that
ends the same way in every subcommand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.speed import scaled
from tokenring_xdit.tools import cli
from tokenring_xdit.tools.compare import CompareConfig
from tokenring_xdit.tools.compare.run import _StepLines
from tokenring_xdit.tools.compare.workers import _timed_call

ROOT = Path(__file__).resolve().parents[2]

# (argv, the start of the message after "error: ")
SEMANTIC = [
    (["compare", "--ring-degree", "1"], "--ring-degree must be at least 2"),
    (["compare", "--nproc", "2", "--ring-degree", "3"], "--ring-degree 3 must equal --nproc 2"),
    (["compare", "--height", "100"], "--height 100 (the width too"),
    (["compare", "--width", "100"], "--width 100 must be a multiple of 8"),
    (["compare", "--width", "64", "--height", "132"], "--height 132 must be a multiple of 8"),
    (["compare", "--nproc", "3"], "the default height 128 (set --height) must be a multiple"),
    (["demo", "--tokens", "1001"], "--tokens 1001 must be a multiple of --nproc 2"),
    (["demo", "--device", "cpu", "--kernel", "cudnn"], "--kernel cudnn has no CPU version"),
    (["plan", "--model", "flux", "--tokens", "4096", "--gpus", "3", "--nodes", "2"], "--gpus 3"),
    (["plan", "--model", "flux"], "give --tokens"),
]

# Each case through cli.main in one fresh interpreter on a machine without a GPU driver; then
# which heavy modules had loaded.
PROGRAM = """
import contextlib, io, json, sys
from tokenring_xdit.tools import cli, cli_args
cli_args._GPU_DRIVER_PATHS = ("/nonexistent/gpu-driver",)  # as on a machine without GPUs
seen = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(argv)
    seen.append((code, err.getvalue()))
heavy = [m for m in ("torch", "rich", "xfuser", "diffusers", "numpy") if m in sys.modules]
print(json.dumps(dict(seen=seen, heavy=heavy)))
"""


@pytest.fixture(scope="module")
def reported() -> dict:
    argvs = [argv for argv, _ in SEMANTIC]
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, json.dumps(argvs)],
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_usage_errors_come_before_torch_rich_or_the_hosts_load(reported):
    assert reported["heavy"] == [], reported


@pytest.mark.parametrize("index", range(len(SEMANTIC)), ids=[" ".join(a) for a, _ in SEMANTIC])
def test_a_usage_error_names_the_flag_given_in_one_line_ending_alike(reported, index):
    (argv, start), (code, err) = SEMANTIC[index], reported["seen"][index]
    prog = f"tokenring-xdit {argv[0]}"
    assert code == cli.EXIT_USAGE, (code, err)
    assert err.count("\n") == 1, err
    assert err.startswith(f"{prog}: error: {start}"), err
    assert err.endswith(f" (see {prog} --help)\n"), err


def test_compare_counts_warm_up_and_timed_steps_apart(capsys):
    """The header says "8 steps after 2 warm-up"; the progress lines count each phase alone
    (they said "step 0/10" beside a header of 8 steps)."""
    import torch
    from rich.console import Console

    cfg = CompareConfig(steps=3, warmup_steps=2)
    console = Console(force_terminal=False)
    lines = _StepLines(console, "xDiT ring", off=False)
    lines.LINE_EVERY_S = 0.0
    shown: list[str] = []

    def report(**fields):
        lines(fields)
        shown.append(capsys.readouterr().out.strip())

    class Timer:  # StepTimer's reporting without its clock
        def start(self):
            return 0.0

        def _now(self):
            return 0.0

        step_s, latents = [], torch.zeros(1)

        def kwargs(self, model):
            return {"callback": lambda step, t, latents: report(advance=1)}

    def pipe(num_inference_steps=cfg.steps, callback=None, callback_steps=1):
        for step in range(num_inference_steps):
            callback(step, None, None)

    _timed_call(pipe, {}, cfg, Timer(), report)
    steps = [s.split(": ", 1)[1].rsplit(" (", 1)[0] for s in shown if s]
    assert steps == [
        "warm-up, step 0/2",
        "warm-up, step 1/2",
        "warm-up, step 2/2",
        "denoising, step 0/3",
        "denoising, step 1/3",
        "denoising, step 2/3",
        "denoising, step 3/3",
    ], shown


# ------------------------------------------------------------------------------- the examples

EXAMPLE = """
import runpy, sys
sys.argv = [sys.argv[1], *sys.argv[2:]]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as exc:
    heavy = ("torch", "xfuser", "diffusers", "transformers", "yunchang")
    heavy = [m for m in heavy if m in sys.modules]
    print(f"exit {exc.code} heavy {heavy}")
"""


@pytest.mark.parametrize("script", ["pixart_tokenring.py", "flux_tokenring.py"])
def test_an_example_refuses_a_misspelled_ring_before_torch_and_xfuser_load(script):
    path = str(ROOT / "examples" / script)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            EXAMPLE,
            path,
            "--ring_degree",
            "2",
            "--ring_impl_type",
            "tokenring",
        ],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        env=dict(os.environ, RANK="1"),
    )
    assert done.stdout.strip() == "exit 2 heavy []", (done.stdout, done.stderr[-2000:])
    assert done.stderr == (
        f"rank 1: {script}: error: argument --ring_impl_type: invalid choice: 'tokenring' "
        "(choose from 'default', 'token_ring', 'auto') (see --help)\n"
    ), done.stderr


# The examples with a parser of their own (not xDiT's): a bad flag and --help answer before
# torch, the hosts or transformers load (importing torch alone took 8 s on a busy machine).
OWN_PARSER = ["hf_llama_tokenring.py", "llm_train_tokenring.py", "diffusers_flux_tokenring.py"]


@pytest.mark.parametrize("script", OWN_PARSER)
def test_an_example_with_its_own_parser_answers_a_bad_flag_and_help_before_torch_loads(script):
    path = str(ROOT / "examples" / script)
    env = dict(os.environ, RANK="1")

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", EXAMPLE, path, *argv],
            capture_output=True,
            text=True,
            timeout=scaled(120),
            env=env,
        )

    bad = run("--steps", "1", "--no-such-flag")
    assert bad.stdout.strip() == "exit 2 heavy []", (bad.stdout, bad.stderr[-2000:])
    assert bad.stderr == (
        f"rank 1: {script}: error: unrecognized arguments: --no-such-flag (see --help)\n"
    ), bad.stderr
    shown = run("--help")
    assert shown.stdout.startswith(f"usage: {script} "), shown.stdout
    assert shown.stdout.rstrip().endswith("exit 0 heavy []"), (shown.stdout, shown.stderr)


def test_the_examples_early_check_leaves_good_and_foreign_flags_to_xdits_parser():
    import importlib.util

    spec = importlib.util.spec_from_file_location("_shared", ROOT / "examples" / "_shared.py")
    shared = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shared)
    for argv in (
        ["--ring_impl_type", "token_ring", "--ring_degree", "2", "--tiny"],
        ["--ring_impl_type=auto", "--warmup_call_steps", "0", "--height", "64"],
        ["--ring", "2"],  # ambiguous in xDiT's parser (--ring_degree, --ring_impl_type): its call
        ["-h"],
    ):
        shared.check_our_flags(argv)  # no SystemExit
    with pytest.raises(SystemExit):
        shared.check_our_flags(["--warmup_call_steps", "two"])
