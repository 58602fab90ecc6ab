"""The before/after tools on CPU: plot_before_after's ratios from the committed
4 x H200 runs (train_sweep and ring_sweep rows, the control columns), and hot_path_host's eager
mode run for real on 2 gloo ranks at a few calls."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.plot_before_after import ratio_points  # noqa: E402
from tests.harness import hot_path_host  # noqa: E402

RUNS = ROOT / "docs" / "benchmarks" / "before-after-ring4-h200-2026-11"


def test_ratios_of_alternated_training_runs():
    old = [RUNS / "mnt4_old_2.json", RUNS / "mnt4_old_4.json"]
    new = [RUNS / "mnt4_new_1.json", RUNS / "mnt4_new_3.json"]
    points = ratio_points(old, new, "token_ring_ms", "token_ring")
    assert set(points) == {"gqa-32-8 16k causal", "mha-32 16k full"}
    assert all(len(r) == 4 for r in points.values())  # every (old, new) pair
    # 7.80 / 7.87, 8.84 / 7.87, 7.80 / 8.44, 8.84 / 8.44 (ms, README)
    got = sorted(round(x, 3) for x in points["gqa-32-8 16k causal"])
    assert got == [0.925, 0.991, 1.047, 1.122], got
    control = ratio_points(old, new, "ulysses", "ulysses")  # a control names an impl
    assert set(control) == set(points) and control != points


def test_ratios_of_sweep_columns():
    old, new = [RUNS / "sweep4_old.json"], [RUNS / "sweep4_new.json"]
    eager = ratio_points(old, new, "token_ring_eager_ms", "token_ring")
    assert abs(eager["flux 16896"][0] - 4.09 / 3.45) < 0.01  # the README's eager row
    assert len(eager) == 5 and all(len(r) == 1 for r in eager.values())
    control = ratio_points(old, new, "torch_ag_ms", "token_ring")
    assert abs(control["flux 16896"][0] - 1.0) < 0.01  # the same run, another ring, unchanged


def test_ratios_of_packed_real_rings():
    runs = RUNS
    old = [runs / "packed4_old_1.json", runs / "packed4_old_2.json"]
    new = [runs / "packed4_new_1.json", runs / "packed4_new_2.json"]
    points = ratio_points(old, new, "auto", "token_ring")  # a packed method by --column
    assert set(points) == {"32k 7 docs ring 4", "128k 28 docs ring 4"}
    # 11.19 / 11.65 ms: new run 1 / old run 1 at 32k (docs/benchmarks/README.md)
    assert abs(points["32k 7 docs ring 4"][0] - 11.1926 / 11.6544) < 0.002, points
    control = ratio_points(old, new, "dense_causal", "dense_causal")
    assert set(control) == set(points) and control != points


def test_hot_path_host_eager_runs_and_counts_calls(tmp_path):
    row = hot_path_host(
        tmp_path / "eager.json", "--path", "eager", "--ranks", "2", "--repeats", "20", "--top",
        "5", "--label", "test", timeout=300,
    )  # fmt: skip
    assert row["ranks"] == 2 and row["repeats"] == 20 and row["label"] == "test"
    assert 0 < row["cpu_us"] and 0 < row["median_us"] <= row["p90_us"]
    assert len(row["top_own_time"]) == 5
    calls = row["calls_per_call"]
    # one ring call per timed call: the forward loop once, the input check's exchange once
    assert calls["tokenring_xdit/ring/inference/loop.py:" + _line("inference/loop.py", "ring_forward")] == 1
    assert row["python_calls_per_call"] > 100
    assert not any(str(ROOT) in k for k in calls)  # no machine paths


def _line(module: str, fn: str) -> str:
    text = (ROOT / "tokenring_xdit" / "ring" / module).read_text().splitlines()
    at = next(i for i, x in enumerate(text, 1) if x.startswith(f"def {fn}("))
    return f"{at}:{fn}"
