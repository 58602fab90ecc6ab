"""Choosing TokenRing in xDiT: the --ring_impl_type flag of xDiT's parsers, the
TOKENRING_XDIT_RING_IMPL environment variable, their precedence, errors, and the rank-0 log line.

(a) The parsers exactly as xDiT builds them (examples/pixartalpha_example.py, xfuser/runner.py),
    in a fresh interpreter (importing xfuser here would need CPU mode in the pytest process).
(b) torchrun-style: 2 gloo ranks that each parse the same argv (or only inherit the environment
    variable) and run USP, an xFuserLongContextAttention built with xDiT's defaults and the tiny
    PixArt pipeline; every rank must report that TokenRing ran. An invalid environment value
    fails every rank with a ValueError listing the valid values.
(c) The announcement "ring attention: ... selected by ..." on logger xfuser.tokenring_xdit:
    once, on global rank 0 only, however many ring calls follow.
(d) `--ring_impl_type auto` on CPU: every call runs TokenRing (no calibration on CPU: the rule),
    and rank 0 logs one "ring attention: auto -> ..." line per distinct call signature.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.speed import scaled
from tests.xdit.launches import CPU_MODE_MARKS, launch, part

pytestmark = CPU_MODE_MARKS

ENV = "TOKENRING_XDIT_RING_IMPL"
VALID = "valid values: default, token_ring, auto"

PARSER_SCRIPT = textwrap.dedent(
    """
    import contextlib, io, json
    from tokenring_xdit.patches import xfuser_cpu
    xfuser_cpu.enable()
    from xfuser import xFuserArgs
    from xfuser.config import FlexibleArgumentParser
    from tokenring_xdit.hosts import selection

    report = {}

    def cli(argv):
        # examples/pixartalpha_example.py
        parser = FlexibleArgumentParser(description="xFuser Arguments")
        args = xFuserArgs.add_cli_args(parser).parse_args(argv)
        engine_args = xFuserArgs.from_cli_args(args)
        return args, engine_args

    args, engine_args = cli(["--model", "m", "--ring_impl_type", "token_ring"])
    report["cli"] = [args.ring_impl_type, type(engine_args).__name__, selection.xdit_ring_impl()]
    args, _ = cli(["--model", "m"])  # a later parse without the flag drops the choice
    report["cli_absent"] = [args.ring_impl_type, selection.xdit_ring_impl()]
    args, _ = cli(["--model", "m", "--ring_impl_type", "default"])
    report["cli_default"] = selection.xdit_ring_impl()
    args, _ = cli(["--model", "m", "--ring_impl_type", "auto"])
    report["cli_auto"] = selection.xdit_ring_impl()

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            cli(["--model", "m", "--ring_impl_type", "tokenring"])
        report["bad"] = None
    except SystemExit as exc:
        report["bad"] = [exc.code, stderr.getvalue()]

    # xfuser/runner.py
    selection.reset()
    parser = FlexibleArgumentParser(description="xFuser Arguments")
    args = xFuserArgs.add_runner_args(parser).parse_args(
        ["--model", "m", "--ring_impl_type", "token_ring"])
    engine_args = xFuserArgs.from_runner_args(vars(args))
    report["runner"] = [vars(args)["ring_impl_type"], type(engine_args).__name__,
                        selection.xdit_ring_impl()]
    # FlexibleArgumentParser takes dashes and "=" too
    selection.reset()
    args, _ = cli(["--model", "m", "--ring-impl-type=token_ring"])
    report["dashes"] = [args.ring_impl_type, selection.xdit_ring_impl()]
    report["help"] = "--ring_impl_type" in xFuserArgs.add_cli_args(
        FlexibleArgumentParser()).format_help()
    # Python call beats the flag
    selection.set_xdit_ring_impl("default")
    report["python_over_flag"] = selection.xdit_ring_impl()
    print(json.dumps(report))
    """
)


@functools.cache
def _parser_report() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop(ENV, None)
    proc = subprocess.run(
        [sys.executable, "-c", PARSER_SCRIPT],
        capture_output=True,
        text=True,
        timeout=scaled(180),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_cli_flag_selects_token_ring() -> None:
    report = _parser_report()
    assert report["cli"] == ["token_ring", "xFuserArgs", ["token_ring", "--ring_impl_type"]]
    assert report["cli_absent"] == [None, ["default", "default"]]
    assert report["cli_default"] == ["default", "--ring_impl_type"]
    assert report["cli_auto"] == ["auto", "--ring_impl_type"]
    assert report["dashes"] == ["token_ring", ["token_ring", "--ring_impl_type"]]
    assert report["help"] is True
    assert report["python_over_flag"] == ["default", "set_xdit_ring_impl()"]


def test_cli_flag_rejects_unknown_value_listing_the_valid_ones() -> None:
    report = _parser_report()
    assert report["bad"] is not None, "argparse accepted --ring_impl_type tokenring"
    code, stderr = report["bad"]
    assert code == 2
    assert "--ring_impl_type" in stderr and "invalid choice: 'tokenring'" in stderr, stderr
    assert "'default'" in stderr and "'token_ring'" in stderr and "'auto'" in stderr, stderr


def test_runner_parser_accepts_the_flag() -> None:
    report = _parser_report()
    assert report["runner"] == ["token_ring", "xFuserArgs", ["token_ring", "--ring_impl_type"]]


def test_precedence_python_then_flag_then_env(monkeypatch) -> None:
    """Pure Python (selection imports no host library): Python call > flag > env > default."""
    from tokenring_xdit.hosts import selection

    monkeypatch.delenv(ENV, raising=False)
    try:
        selection.reset()
        assert selection.xdit_ring_impl() == ("default", "default")
        monkeypatch.setenv(ENV, "auto")
        assert selection.xdit_ring_impl() == ("auto", ENV)
        monkeypatch.setenv(ENV, "token_ring")
        assert selection.xdit_ring_impl() == ("token_ring", ENV)
        selection.set_from_flag("default")
        assert selection.xdit_ring_impl() == ("default", "--ring_impl_type")
        selection.set_xdit_ring_impl("token_ring")
        assert selection.xdit_ring_impl() == ("token_ring", "set_xdit_ring_impl()")
        selection.set_xdit_ring_impl(None)
        assert selection.xdit_ring_impl() == ("default", "--ring_impl_type")
        with pytest.raises(ValueError, match=VALID):
            selection.set_xdit_ring_impl("ring")
        selection.reset()
        monkeypatch.setenv(ENV, "TokenRing")
        with pytest.raises(ValueError, match=f"{ENV}='TokenRing': use one of default, token"):
            selection.xdit_ring_impl()
    finally:
        selection.reset()


# --- (b) and (c): torchrun-style ranks ------------------------------------------------------

_SPEC = dict(
    device="cpu",
    dtype="float32",
    ulysses=1,
    ring=2,
    impls=(None,),  # no Python call: the flag or the environment decides
    parts=("usp", "long_ctx_env", "pixart"),
    usp_cases=("plain", "joint_front"),
)


@functools.cache
def _flag_launch() -> list[dict]:
    return launch(dict(_SPEC, argv=["--ring_impl_type", "token_ring"]), 2, env={ENV: ""})


@functools.cache
def _env_launch() -> list[dict]:
    return launch(_SPEC, 2, env={ENV: "token_ring"})


@functools.cache
def _invalid_env_launch() -> list[dict]:
    spec = dict(_SPEC, parts=("usp", "long_ctx_env"))  # the pipeline fails the same way
    return launch(spec, 2, env={ENV: "tokenring"})


_LAUNCHES = {"flag": (_flag_launch, "--ring_impl_type"), "env": (_env_launch, ENV)}


@pytest.mark.parametrize("how", list(_LAUNCHES))
def test_every_rank_runs_token_ring(how: str) -> None:
    run, source = _LAUNCHES[how]
    for result in run():
        rank = result["rank"]
        assert result["selection"] == ["token_ring", source], (rank, result["selection"])
        usp = part(result, "usp")
        for case in _SPEC["usp_cases"]:
            got = usp[f"None/{case}"]
            assert got["usp_ring_attn"] == 1 and got["kernel_calls"] == 2, (rank, case, got)
            assert got["templated_ring"] == 0, (rank, case, got)
        layer = part(result, "long_ctx_env")
        assert layer["ring_fn_is_token_ring"], (rank, layer["ring_fn"])
        assert layer["kernel_calls"] == 2, (rank, layer)
        pixart = part(result, "pixart")
        calls = pixart["expected_ring_calls"]
        got = pixart["None"]
        assert got["usp_ring_attn"] == calls and got["kernel_calls"] == 2 * calls, (rank, got)
        assert got["templated_ring"] == 0, (rank, got)


@pytest.mark.parametrize("how", list(_LAUNCHES))
def test_announcement_once_on_rank_zero(how: str) -> None:
    run, source = _LAUNCHES[how]
    results = run()
    line = f"ring attention: TokenRing (tokenring_xdit), selected by {source}"
    assert results[0]["announced"] == [line], results[0]["announced"]
    for result in results[1:]:
        assert result["announced"] == [], (result["rank"], result["announced"])


def test_invalid_env_value_fails_every_rank_with_the_valid_values() -> None:
    for result in _invalid_env_launch():
        rank = result["rank"]
        for name in ("usp", "long_ctx_env"):
            got = result[name]
            assert got.get("error_type") == "ValueError", (rank, name, got.get("error"))
            assert f"{ENV}='tokenring': use one of default, token_ring, auto" in got["error"], (
                rank,
                name,
                got["error"],
            )
        assert result["announced"] == [], (rank, result["announced"])


# --- (d) auto ------------------------------------------------------------------------------


@functools.cache
def _auto_launch() -> list[dict]:
    spec = dict(_SPEC, argv=["--ring_impl_type", "auto"], usp_cases=("plain", "joint_front"))
    return launch(spec, 2, env={ENV: ""})


def test_auto_runs_token_ring_on_cpu_and_logs_each_signature_once() -> None:
    results = _auto_launch()
    for result in results:
        rank = result["rank"]
        assert result["selection"] == ["auto", "--ring_impl_type"], (rank, result["selection"])
        usp = part(result, "usp")
        for case in ("plain", "joint_front"):
            got = usp[f"None/{case}"]
            assert got["usp_ring_attn"] == 1 and got["templated_ring"] == 0, (rank, case, got)
        assert part(result, "long_ctx_env")["kernel_calls"] == 2, rank
        pixart = part(result, "pixart")
        got, calls = pixart["None"], pixart["expected_ring_calls"]
        assert got["usp_ring_attn"] == calls and got["templated_ring"] == 0, (rank, got)
    lines = results[0]["announced"]
    # signatures: USP plain (its long-context twin has the same one), USP with joint tokens,
    # PixArt's self-attention; each logged once although PixArt alone makes many calls
    assert len(lines) == len(set(lines)) == 3, lines
    for line in lines:
        assert line.startswith("ring attention: auto -> TokenRing for "), line
        assert ", ring 2 (cpu: no calibration" in line, line
    assert "4x16, batch 2, 12 tokens, ring 2" in lines[0], lines
    for result in results[1:]:
        assert result["announced"] == [], (result["rank"], result["announced"])
