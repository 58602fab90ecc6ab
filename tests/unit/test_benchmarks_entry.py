"""benchmarks/: one entry (`python -m benchmarks <name>`) for the sweeps users run; every entry
is a script there, README.md's table is the registry's, and the entry really runs a script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import benchmarks  # noqa: E402


def test_every_entry_is_a_script_and_the_readme_table_is_the_registry():
    for name in benchmarks.SWEEPS:
        assert benchmarks.script(name).is_file(), name
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    assert benchmarks.table_markdown() in readme, "benchmarks/README.md's table is stale"
    # _name.py: helpers the scripts share (not entries)
    top = {p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.stem.startswith("_")}
    assert top == set(benchmarks.SWEEPS), top ^ set(benchmarks.SWEEPS)


def test_the_entry_lists_and_runs_a_script(tmp_path):
    listed = subprocess.run(
        [sys.executable, "-m", "benchmarks"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert all(name in listed.stdout for name in benchmarks.SWEEPS)
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks", "packed_varlen", "--help"],  # no GPU, no plotting
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0 and "usage: packed_varlen.py" in run.stdout, run.stderr[-2000:]
    bad = subprocess.run(
        [sys.executable, "-m", "benchmarks", "nope"], cwd=ROOT, capture_output=True
    )
    assert bad.returncode == 2
