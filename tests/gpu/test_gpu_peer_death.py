"""A peer that dies mid-loop on NCCL: the survivor raises one TokenRingCommError in its own
thread within the deadline plus a few seconds and exits with the code it chooses, no SIGABRT
(issue 44). The scenario and its measurements: benchmarks/diagnostics/peer_death.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.diagnostics.peer_death import run  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]

DEADLINE_S = 8.0


@pytest.mark.parametrize(
    "mode, graphs", [("train", 0), ("infer", 0), ("infer", 1)], ids=["train", "infer", "graphed"]
)
def test_survivor_raises_a_named_error_after_a_peer_dies(mode, graphs):
    result = run(mode=mode, graphs=graphs, timeout=DEADLINE_S, tokens=16384, wall=120)
    print(result)
    assert not result["sigabrt"], result["stderr_tail"]
    assert result["survivor_error"] is not None, result
    assert result["survivor_error"]["type"] == "TokenRingCommError", result
    assert "global rank" in result["survivor_error"]["message"], result
    assert result["survivor_exit_code"] == 3, result
    assert result["error_after_death_s"] < DEADLINE_S + 10, result
