"""benchmarks/_cp_verdicts.py: which backend diffusers_cp.py calls faster, and the reason it
writes from the measured parts of a step (the GPU branch, which the CPU run never takes)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # sibling imports

from _cp_verdicts import reason, table, verdicts  # noqa: E402


def _row(setting, backend, ms, nccl_open, attention=60.0, spread=1.0, ring_bytes=8e6):
    other = ms - attention - nccl_open - 2.0
    timeline = dict(
        window_ms=ms, attention_ms=attention, nccl_in_the_open_ms=nccl_open,
        merge_copy_other_in_the_open_ms=other, gpu_idle_ms=2.0,
    )  # fmt: skip
    return dict(
        model="wan-1.3b", setting=setting, backend=backend, median_step_ms=ms,
        step_ms=[ms - spread / 2, ms, ms + spread / 2], ring_bytes_per_step=ring_bytes,
        a2a_bytes_per_step=0, profile=dict(timeline=timeline), efficiency=0.9,
        max_abs=1e-2, rel_l2=1e-3,
    )  # fmt: skip


def test_the_reason_names_the_part_of_the_step_that_grew():
    ours = _row("ring2", "token_ring", 100.0, nccl_open=1.0)
    theirs = _row("ring2", "diffusers_ring", 112.0, nccl_open=13.0)
    got = reason(ours, theirs)
    assert got.startswith("token_ring ring2 100.0 ms/step vs diffusers_ring ring2 112.0 (1.120x)")
    assert "grew most in NCCL outside attention" in got and "13.0 vs 1.0 ms" in got, got
    assert "attention is 60% vs 54% of the step" in got, got
    assert "each rank sends 8 vs 8 MB per step" in got and "tie" not in got, got


def test_a_gap_inside_the_step_spread_is_called_a_tie():
    a = _row("ring2", "token_ring", 100.0, nccl_open=1.0, spread=4.0)
    b = _row("ring2", "diffusers_ring", 102.0, nccl_open=1.0, spread=1.0)
    assert "a tie: the gap is within the step-to-step spread (4.0 ms)" in reason(a, b)


def test_verdicts_per_setting_and_the_fastest_against_the_other_family():
    rows = [
        dict(_row("one_gpu", "_native_cudnn", 180.0, 0.0), efficiency=1.0),
        _row("ring2", "token_ring", 100.0, nccl_open=1.0),
        _row("ring2", "diffusers_ring", 112.0, nccl_open=13.0),
        dict(_row("ulysses2", "diffusers_ulysses", 95.0, nccl_open=5.0), ring_bytes_per_step=0),
    ]
    got = {v["setting"]: v for v in verdicts(rows)}
    assert set(got) == {"ring2", "fastest"}, got
    assert got["ring2"]["faster"] == "token_ring ring2", got
    assert abs(got["ring2"]["speedup"] - 1.12) < 1e-9
    # ulysses wins overall; its rival is TokenRing's best, not diffusers' own ring
    assert (got["fastest"]["faster"], got["fastest"]["slower"]) == (
        "diffusers_ulysses ulysses2",
        "token_ring ring2",
    )
    lines = table(rows).splitlines()
    assert len(lines) == 5 and lines[2].split()[:4] == ["wan-1.3b", "ring2", "token_ring", "100.0"]
