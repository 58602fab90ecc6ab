"""The packaged data records where it comes from (command, commit, machine, date), and the derived
files are what their documented command makes from the committed measurements."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLANNER = ROOT / "tokenring_xdit" / "planner" / "data"
RING = ROOT / "tokenring_xdit" / "ring" / "packed" / "data"
sys.path.insert(0, str(ROOT / "benchmarks"))
import derive_planner_data  # noqa: E402

DERIVED = ["blocks_h200_derived.json", "fabrics.json", "params.json", "ceiling_h200.json"]


def _provenance(data: dict) -> dict:
    return data.get("provenance") or data["meta"]["provenance"]


@pytest.mark.parametrize("name", DERIVED)
def test_a_derived_file_names_its_command_and_its_measurements(name):
    prov = _provenance(json.loads((PLANNER / name).read_text()))
    assert prov["command"] == "python benchmarks/derive_planner_data.py"
    assert prov["measured"], name
    for entry in prov["measured"]:
        assert (ROOT / entry["folder"]).is_dir(), entry
        assert {"machine", "date", "commit"} <= set(entry), entry


@pytest.mark.parametrize("name", ["blocks_h200.json", "blocks_h100.json"])
def test_a_measured_kernel_table_names_command_commit_machine_and_date(name):
    meta = json.loads((PLANNER / name).read_text())["meta"]
    assert meta["command"].startswith("python benchmarks/calibrate_blocks.py")
    assert meta["commit"] and meta["machine"] and meta["time"][:4] == "2026"


def test_the_packed_cost_table_names_its_command_and_replays():
    prov = json.loads((RING / "cost_model.json").read_text())["provenance"]
    assert prov["command"] == "python benchmarks/fit_layout_cost.py"
    for entry in prov["measured"]:
        assert (ROOT / entry["file"]).is_file() and {"machine", "date", "commit"} <= set(entry)


def _same(got, want, where: str = "") -> None:
    """Equal structure and strings; numbers equal to 1e-3 relative (the fits' optimiser)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for key in want:
            _same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            _same(a, b, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(want, bool):
        assert math.isclose(got, want, rel_tol=1e-3, abs_tol=1e-9), (where, got, want)
    else:
        assert got == want, (where, got, want)


def test_derive_planner_data_remakes_the_packaged_files(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # its default --bench-dir is relative to the repository root
    assert derive_planner_data.main(["--out-dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(DERIVED)
    for name in DERIVED:
        got = json.loads((tmp_path / name).read_text())
        _same(got, json.loads((PLANNER / name).read_text()), name)
