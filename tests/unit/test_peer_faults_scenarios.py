"""The verdict rules of tests/peer_faults/scenarios.py (`problems`), on which the CPU and
GPU peer-fault tests rest: each rule flags what it should, and the GPU test's xfail table names
only scenarios of the GPU matrix."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.peer_faults.scenarios import GPU_MATRIX, Scenario, problems  # noqa: E402

MESSAGE = (
    "TokenRing partial transfer at step 2 on the return lane (send to ring rank 1 (global rank "
    "1), ...) failed on ring rank 0 (global rank 0): Connection reset by peer"
)


def _result(fault="die", launcher="plain", **survivor) -> dict:
    s = dict(rank=0, first_error=dict(type="TokenRingCommError", message=MESSAGE, call=31,
                                      thread="MainThread"),
             delay_s=8.1, exit_code=3, stopped_by_launcher=False, sigabrt=False, core=False,
             names_rank=True, names_step=True, killed_by_harness=False, continued=None,
             gone_after_error_s=1.3)  # fmt: skip
    s.update(survivor)
    r = dataclasses.asdict(Scenario("train", fault, launcher)) | {"survivors": [s]}
    if launcher == "torchrun":
        r["torchrun"] = dict(rc=1, root_cause_rank=1 if fault == "die" else 0)
    return r


def test_a_named_error_in_time_with_the_programs_code_passes():
    assert problems(_result()) == []


def test_each_missing_promise_is_flagged():
    assert problems(_result(delay_s=14.5))  # deadline 8 + 6
    assert problems(_result(names_rank=False))
    assert problems(_result(names_step=False))
    assert problems(_result(exit_code=1))
    assert problems(_result(exit_code=-6, sigabrt=True))
    assert problems(_result(killed_by_harness=True, exit_code=-9))
    assert problems(_result(gone_after_error_s=30.6))  # the exit waited on a stopped peer
    assert problems(_result(first_error=None, delay_s=None))
    other = dict(type="RuntimeError", message=MESSAGE, call=31, thread="MainThread")
    assert problems(_result(first_error=other))
    went_on = _result() | {"then": "continue"}
    assert problems(went_on)  # no record of working on afterwards
    went_on["survivors"][0]["continued"] = {"ok": True, "error": None}
    assert problems(went_on) == []


def test_torchrun_stopping_the_survivor_after_a_death_passes_unless_it_aborts():
    stopped = dict(first_error=None, delay_s=None, exit_code=None, stopped_by_launcher=True)
    assert problems(_result("die", "torchrun", **stopped)) == []
    assert problems(_result("die", "torchrun", exit_code=-15)) == []  # raised, then stopped
    assert problems(_result("die", "torchrun", **(stopped | dict(exit_code=-6, sigabrt=True))))
    blamed_wrong = _result("die", "torchrun", **stopped)
    blamed_wrong["torchrun"]["root_cause_rank"] = 0
    assert problems(blamed_wrong)


def test_torchrun_with_a_hung_peer_needs_the_survivors_error_and_exit():
    assert problems(_result("hang", "torchrun")) == []
    assert problems(_result("hang", "torchrun", first_error=None, delay_s=None, exit_code=None))


def test_the_gpu_xfail_table_names_gpu_scenarios():
    pytest = __import__("pytest")
    pytest.importorskip("torch")
    from tests.gpu.test_gpu_peer_death import XFAIL

    assert set(XFAIL) <= {s.name for s in GPU_MATRIX}, set(XFAIL) - {s.name for s in GPU_MATRIX}
