"""The planner's kernel ceiling (planner/ceiling.py) and its training/causal predictions
(planner/workload.py): where the ring's ceiling is below ulysses, the plan picks ulysses and
says why; the split-block model fits what it is given; nothing here loads torch."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tokenring_xdit.planner.ceiling import (
    SplitModel,
    fit_split_model,
    kernel_ceiling,
    load_models,
    rank_blocks,
)
from tokenring_xdit.planner.cost import predict
from tokenring_xdit.planner.machine import make_machine
from tokenring_xdit.planner.plan import rank_all, reason
from tokenring_xdit.planner.workload import Workload
from tokenring_xdit.tools import plan_cli as cli

TRAIN_CAUSAL = Workload(causal=True, train=True)


def test_causal_training_at_4k_per_gpu_on_4_gpus_picks_ulysses_and_says_why():
    # measured: ring 4 causal zigzag at 16k tokens (4k per GPU) measured 0.464 vs ulysses 0.843.
    # The ceiling measured on one H200 (docs/benchmarks/kernel-ceiling-h200-2026-11-26/) is 0.84
    # there, so the ring
    # loses to its per-step costs, not its kernels: the plan picks ulysses on the predictions,
    # names the best ring split, its prediction and its ceiling
    m = make_machine(4)
    choices = rank_all(m, 32, 128, 16384, kv_heads=8, workload=TRAIN_CAUSAL)
    best = choices[0]
    assert (best.prediction.ulysses, best.prediction.ring) == (4, 1)
    ring4 = next(c for c in choices if c.prediction.ring == 4)
    assert ring4.efficiency < best.efficiency < ring4.ceiling
    text = reason(choices, 16384, TRAIN_CAUSAL)
    ring_best = next(c for c in choices if c.prediction.ring > 1)
    assert f"predicted efficiency {best.efficiency:.3f}" in text
    assert f"predicted {ring_best.efficiency:.3f}, ceiling {ring_best.ceiling:.3f}" in text
    # only TokenRing and ulysses are modelled for training
    assert {c.prediction.method for c in choices} == {"ulysses", "token_ring_eager"}


def test_long_sequences_leave_the_ring_its_ceiling():
    # 128k tokens at ring 4 (32k per GPU): the ceiling is near 1 and the ring's prediction too
    m = make_machine(4)
    choices = rank_all(m, 32, 128, 131072, kv_heads=8, workload=TRAIN_CAUSAL)
    ring4 = next(c for c in choices if c.prediction.ring == 4)
    assert ring4.ceiling > 0.95 and ring4.efficiency > 0.85


def test_the_forward_ranking_is_the_simulation_and_now_carries_the_ceiling():
    m = make_machine(4)
    for c in rank_all(m, 24, 128, 16384):
        p = c.prediction
        direct = predict(m, p.method, 24, 128, 16384, p.ulysses, p.ring)
        assert p.ms == pytest.approx(direct.ms)
        assert (c.ceiling is None) == (p.ring == 1)


def test_the_shipped_fits_reproduce_their_measured_points():
    fits, meta = load_models("NVIDIA H200")
    assert fits and meta["path"].endswith("ceiling_h200.json")
    data = json.loads(Path(meta["path"]).read_text())
    for f in data["fits"]:
        for ring, tokens, measured in f["points"]:
            got, where = kernel_ceiling(f["mask"], f["pass"], ring, tokens, f["heads"],
                                        f["kv_heads"], f["head_dim"])  # fmt: skip
            assert (
                abs(got - measured) <= f["max_abs_residual"] + 1e-3
            )  # (rounded), (f["mask"], ring, tokens)
            assert "fitted" in where


def test_the_split_model_fit_recovers_its_parameters():
    truth = SplitModel(400.0, 5e5)
    points = [(n, s, truth.ceiling(n, s, True, True))
              for n in (2, 4, 8) for s in (16384, 32768, 65536)]  # fmt: skip
    fit = fit_split_model(points, causal=True, train=True)
    assert fit.lam == pytest.approx(400.0, rel=0.02) and fit.mu == pytest.approx(5e5, rel=0.05)
    # a bigger per-call cost can only lower the ceiling
    assert SplitModel(400.0, 1e6).ceiling(4, 16384, True, True) < truth.ceiling(
        4, 16384, True, True
    )


def test_without_a_measurement_there_is_no_ceiling_but_the_forward_has_its_table(monkeypatch):
    # packed documents are probed (benchmarks/ceiling.py) but not modelled: no fit covers them
    assert kernel_ceiling("packed", "fwd+bwd", 4, 32768)[0] is None
    # without any fitted data the non-causal forward falls back to the calibration table
    import tokenring_xdit.planner.ceiling as ceiling_module

    monkeypatch.setattr(ceiling_module, "load_models", lambda device_name="": ((), {}))
    m = make_machine(4)
    c, where = kernel_ceiling("full", "fwd", 4, 16384, 24, table=m.table)
    assert where == "calibration table" and 0.5 < c < 1.2
    assert kernel_ceiling("causal", "fwd", 4, 16384)[0] is None
    assert kernel_ceiling("causal", "fwd+bwd", 1, 16384)[0] == 1.0


def test_rank_blocks_cover_the_work_of_the_whole_sequence():
    # every (query, key) pair is attended once over the ring (zigzag and non-causal)
    for causal in (True, False):
        whole = rank_blocks(1, 0, 4096, causal=causal, train=True)[0].pairs
        split = sum(b.pairs for r in range(4)
                    for b in rank_blocks(4, r, 1024, causal=causal, train=True))  # fmt: skip
        assert split == whole if not causal else split == pytest.approx(whole, rel=1e-3)


def test_the_planner_ceiling_imports_without_torch():
    code = (
        "import sys, tokenring_xdit.planner.ceiling as c, tokenring_xdit.planner.workload; "
        "c.kernel_ceiling('causal', 'fwd+bwd', 4, 16384); assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cli_plan_shows_the_ceiling_and_the_reason(capsys):
    parser = cli.argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args("--heads 32 --kv-heads 8 --head-dim 128 --tokens 16384 --gpus 4 "
                             "--causal --train".split())  # fmt: skip
    assert cli.run(args) == 0
    out = capsys.readouterr().out
    assert "workload: causal fwd+bwd" in out and " eff ceiling " in out
    assert "best: ulysses 4 x ring 1" in out and "why: predicted efficiency" in out
    args = parser.parse_args("--model flux --resolution 1024 --gpus 2 --ceiling".split())
    assert cli.run(args) == 0
    assert " eff ceiling " in capsys.readouterr().out


ROOT = Path(__file__).resolve().parents[2]


def test_the_training_model_meets_the_forward_target_on_the_committed_train_sweeps():
    from tokenring_xdit.planner.validate import MAX_MEDIAN_ERROR
    from tokenring_xdit.planner.validate_train import training_lines, validate_training

    checks = validate_training(ROOT / "docs" / "benchmarks")
    assert len(checks) >= 40 and {c.method for c in checks} == {"token_ring", "ulysses"}
    assert statistics.median(abs(c.error) for c in checks) <= MAX_MEDIAN_ERROR
    assert training_lines(ROOT / "docs" / "benchmarks")[-1].startswith("training (forward")


def test_ring_8_and_16_predictions_anchor_on_ring_4():
    sys.path.insert(0, str(ROOT / "benchmarks" / "diagnostics"))
    import predict_rings

    measured = json.loads(Path(predict_rings.DEFAULT_MEASURED).read_text())["rows"]
    rows = predict_rings.predict(measured)
    shares = {(r["workload"], r["per_gpu"]): r["share_of_ceiling"] for r in rows if r["ring"] == 4}
    assert len(shares) == 9
    at8 = [r for r in rows if r["ring"] == 8]
    assert {r["tokens"] for r in at8} == {16384, 32768, 131072}
    for r in at8:
        if r["per_gpu"] == 4096:  # measured at ring 4 with 4k per GPU: that share exactly
            assert r["anchored"] == pytest.approx(r["ceiling"] * shares[(r["workload"], 4096)])
        assert 0 < r["planner"] < 1.2 and 0 < r["anchored"] <= r["ceiling"]
    assert {r["machine"].split(",")[0] for r in rows if r["ring"] == 16} == {
        "1 node(s) x 16 NVIDIA H200", "2 node(s) x 8 NVIDIA H200"
    }  # fmt: skip
