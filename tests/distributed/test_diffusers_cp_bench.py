"""benchmarks/diffusers_cp.py --tiny end to end: `torchrun --nproc-per-node 2` as the GPU command
is typed, on gloo with tiny random Wan and Flux transformers (fp32, diffusers' CP through
tokenring_xdit's CPU shims). Every CP run's final latents (a 2-step Euler loop) are checked
against the one-process reference the script computes in the same run; TokenRing must have run
(one call per CP attention layer per step) and posted exactly the bytes the script reports."""

from __future__ import annotations

import json

from tests.harness import torchrun_script

TOL = 1e-5  # fp32, max |err| of the final latents
LAYERS = {"wan-tiny": 2, "flux-tiny": 2}  # CP attention calls per forward (self / joint)


def test_tiny_run_matches_one_process(tmp_path):
    out = tmp_path / "dcp.json"
    done = torchrun_script("benchmarks/diffusers_cp.py", "--tiny", "--out", str(out), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = {(r["model"], r["setting"], r["backend"]): r for r in result["rows"]}
    want = {
        (model, setting, backend)
        for model in LAYERS
        for setting, backend in (
            ("one_gpu", "_native_flash"),
            ("ring2", "token_ring"),
            ("ring2", "diffusers_ring"),
            ("ulysses2", "diffusers_ulysses"),
        )
    }
    assert set(rows) == want, sorted(rows)
    for (model, setting, backend), row in rows.items():
        assert len(row["step_ms"]) == 2 and row["median_step_ms"] > 0, row
        if setting == "one_gpu":
            continue
        assert row["max_abs"] <= TOL and row["rel_l2"] <= 1e-6, (model, backend, row)
        calls = LAYERS[model] if backend == "token_ring" else 0
        assert row["token_ring_calls_per_step"] == calls, (model, backend, row)
    for model in LAYERS:
        ours = rows[model, "ring2", "token_ring"]
        # the script's byte formula is what TokenRing's own counters saw (eager on CPU)
        assert ours["p2p_bytes_counted_per_step"] == ours["ring_bytes_per_step"] > 0, ours
        uly = rows[model, "ulysses2", "diffusers_ulysses"]
        assert uly["a2a_bytes_per_step"] > 0 and uly["ring_bytes_per_step"] == 0, uly
    settings = {(v["model"], v["setting"]) for v in result["verdicts"]}
    assert settings == {(m, s) for m in LAYERS for s in ("ring2", "fastest")}, settings
    for v in result["verdicts"]:
        assert v["speedup"] >= 1.0 and "ms/step" in v["reason"], v
    assert [y["model"] for y in result["yardstick"]] == list(LAYERS), result["yardstick"]
    assert all(y["max_abs"] <= TOL for y in result["yardstick"]), result["yardstick"]
    assert "ms/step" in done.stdout and "token_ring" in done.stdout, done.stdout[-2000:]
