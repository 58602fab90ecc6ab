"""A peer that dies, hangs or raises mid-loop on CPU (gloo): every survivor raises one
TokenRingCommError in the thread that called, within the deadline (3 s) + 6 s, naming the faulty
rank and the step, and exits with the program's code (3), no SIGABRT. Under torchrun:
a peer that exits is named by torchrun's report as the root cause (the agent stops the survivor),
a peer that hangs is stopped after the survivor raised and exited 3.

The scenarios are tests/peer_faults/scenarios.py's CPU_MATRIX (paths x faults x launchers, real gloo ranks, tiny
sizes), run once for the module: the plain-process ones forked from one server that imported
torch once (the same worker program, `python -c` costs ~2 s of CPU per rank), eight at a time,
next to the torchrun ones and one `python -c` pair. Each test asserts one scenario's verdict
(`scenarios.problems`: the rules above). On a slow or busy machine the deadline, the slack, the
exit bound and the wall all grow by its measured slowness (tests/speed.py).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.peer_faults.scenarios import CPU_MATRIX, Scenario, run_many  # noqa: E402
from tests.speed import slowness  # noqa: E402


def _stretched(s: Scenario) -> Scenario:
    f = slowness()
    return dataclasses.replace(s, deadline=s.deadline * f, wall=s.wall * f, stretch=f)


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    return {r["name"]: r for r in run_many([_stretched(s) for s in CPU_MATRIX], jobs=4, forks=8)}


@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", [s.name for s in CPU_MATRIX])
def test_survivor_raises_one_named_error_and_exits(results, name):
    r = results[name]
    survivor = r["survivors"][0]
    summary = (f"{name}: {r['problems']}\nsurvivor: {survivor}\nfault: {r['fault_event']}\n"
               f"timeline: {r['timeline']}\ntorchrun: {r.get('torchrun')}\n"
               f"{r['stderr_tail']}")  # fmt: skip
    assert r["fault_event"] is not None, summary  # the fault happened (the scenario ran)
    assert r["problems"] == [], summary
