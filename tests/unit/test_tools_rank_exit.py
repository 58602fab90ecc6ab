"""Our errors under torchrun: one line per rank, cause first; everyone else's keep their
traceback, and so do ours with LOG_LEVEL=debug (tokenring_xdit/tools/rank_exit.py)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from tests.speed import scaled
from tokenring_xdit.tools.rank_exit import one_line_usage_errors, raised_by, run_main

ROOT = Path(__file__).resolve().parents[2]


def _ours():
    from tokenring_xdit.config import RingConfig

    os.environ["TOKENRING_XDIT_TIMEOUT"] = "abc"
    try:
        RingConfig.from_env()
    finally:
        del os.environ["TOKENRING_XDIT_TIMEOUT"]


def _theirs():
    import json

    json.loads("{")


def test_our_error_is_one_line_and_exit_1(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.delenv("LOG_LEVEL", raising=False)
    with pytest.raises(SystemExit) as info:
        run_main(_ours, str(ROOT / "examples" / "x.py"))
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("rank 3: ValueError: TOKENRING_XDIT_TIMEOUT='abc'"), err
    assert err.rstrip().endswith("(LOG_LEVEL=debug shows the traceback)"), err


def test_other_errors_and_debug_keep_the_traceback(monkeypatch):
    script = str(ROOT / "examples" / "x.py")
    with pytest.raises(ValueError) as info:  # json's own error: not ours, raised unchanged
        run_main(_theirs, script)
    assert not raised_by(info.value, (ROOT / "tokenring_xdit",))
    monkeypatch.setenv("LOG_LEVEL", "DEBUG")
    with pytest.raises(ValueError, match="TOKENRING_XDIT_TIMEOUT"):
        run_main(_ours, script)


def test_an_error_of_the_script_itself_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("LOG_LEVEL", raising=False)
    script = tmp_path / "train.py"
    script.write_text("def main():\n    raise NotImplementedError('no such mode: use --mode a')\n")
    namespace: dict = {}
    exec(compile(script.read_text(), str(script), "exec"), namespace)
    with pytest.raises(SystemExit):
        run_main(namespace["main"], str(script))
    assert "rank 0: NotImplementedError: no such mode: use --mode a" in capsys.readouterr().err


def test_usage_errors_are_one_line(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    parser = one_line_usage_errors(argparse.ArgumentParser(prog="ex.py"))
    parser.add_argument("--ring", choices=["a", "b"])
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["--ring", "c"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rank 1: ex.py: error: argument --ring"), err


def test_a_quick_exit_runs_the_exit_handlers_and_skips_the_teardown(tmp_path):
    """exit_without_teardown: threads joined, exit handlers run, output flushed, exit code kept;
    the interpreter's finalisation (here: a module global's __del__) is skipped."""
    import subprocess
    import sys

    code = f"""
import atexit, sys, threading, time
from tokenring_xdit.tools.rank_exit import exit_without_teardown
class Torn:
    def __del__(self):
        open({str(tmp_path / "torn")!r}, "w").close()
kept = Torn()
atexit.register(lambda: open({str(tmp_path / "handler")!r}, "w").close())
threading.Thread(target=lambda: (time.sleep(0.3), print("thread done", file=sys.stderr))).start()
sys.stdout.write("no newline, buffered")  # printed before the thread ends
exit_without_teardown(3)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=scaled(60)
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "no newline, buffered" and "thread done" in done.stderr, done
    assert (tmp_path / "handler").exists()
    assert not (tmp_path / "torn").exists()
