"""A peer that dies, hangs or raises mid-loop on NCCL (2 GPUs): every survivor raises one
TokenRingCommError in the thread that called, within the deadline (8 s) + 6 s, naming the faulty
rank and the step, and exits with the program's code (3), no SIGABRT; under torchrun the agent's
report names the right rank. One test per scenario of tests/peer_faults/scenarios.py's GPU_MATRIX
(path x fault x launcher; the rules: `scenarios.problems`), all run once for the module, six
at a time (about 6 minutes). Without 2 GPUs every case is skipped (a skip is not a pass).

XFAIL lists the scenarios expected to fail, strict: a fixed one then fails as XPASS and its
entry must go. Measured on 2 x H200 and 4 x H200 (torch 2.11, NCCL 2.28.9, deadline 8 s), the
matrix three times:
every survivor raised TokenRingCommError 8.0-10.2 s after the fault in the calling thread
(compiled 12 s), naming the rank and the step; the packed path's host used to block inside the
call (a cu_seqlens copy behind the dead peer's transfers: fixed); 9 of 12 plain survivors then
died in std::terminate at exit (SIGABRT), fixed by ending the groups at exit after a ring failed.
CUDA-graph replays (4 x H200, 2026-11-27): NCCL's abort waits until every graph that
captured the communicator is destroyed (the watchdog drops our graphs once the aborts are under
way); a destroy_process_group after a stopped peer waited for it (now aborted instead); and with
replay step marks the watchdog blocked in cuEventDestroy while a graph launch was blocked behind
the stuck replay (it no longer destroys events). Measured twice after that: every scenario passed
(error 8.0-8.9 s after the fault, exit 1.2-3.0 s after the error). Graph replays name their
peers, not their step, unless TOKENRING_XDIT_REPLAY_STEP_MARKS=1 (the "-marks" scenarios check
the step).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.peer_faults.scenarios import GPU_MATRIX, run_many  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]

# Scenarios expected to fail (name -> why), strict: a fixed one fails as XPASS and must go.
XFAIL: dict[str, str] = {}


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    return {r["name"]: r for r in run_many(list(GPU_MATRIX), jobs=6)}


def _case(name: str):
    if name in XFAIL:
        reason = f"known, open: {XFAIL[name]}"
        return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=reason))
    return name


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", [_case(s.name) for s in GPU_MATRIX])
def test_survivor_raises_one_named_error_and_exits(results, name):
    r = results[name]
    native = "".join(f"\nnative stacks of {k} (py-spy):\n{v[-4000:]}"
                     for k, v in (r.get("native_stacks") or {}).items())  # fmt: skip
    summary = (f"{name}: {r['problems']}\nsurvivors: {r['survivors']}\nfault: "
               f"{r['fault_event']}\ntimeline: {r['timeline']}\ntorchrun: {r.get('torchrun')}\n"
               f"{r['stderr_tail']}{native}")  # fmt: skip
    assert r["fault_event"] is not None, summary  # the fault happened (the scenario ran)
    assert r["problems"] == [], summary
