"""An example under torchrun with a mistake of ours: one line per rank, no rank traceback
(tokenring_xdit/tools/rank_exit.py; tests/unit/test_tools_rank_exit.py has the pieces)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.harness import torchrun_script

ROOT = Path(__file__).resolve().parents[2]


def test_an_example_under_torchrun_prints_one_line_per_rank():
    """The packed-length mistake of docs/training.md under torchrun: each rank says it in one
    line; no rank prints a traceback (torchrun's own report follows; it is not ours)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.pop("LOG_LEVEL", None)
    done = torchrun_script("examples/hf_llama_tokenring.py", "--seq", "90", "--steps", "1",
                           env=env)  # fmt: skip
    assert done.returncode != 0
    ours = [line for line in done.stderr.splitlines() if line.startswith("rank ")]
    assert sorted(line[:7] for line in ours) == ["rank 0:", "rank 1:"], done.stderr[-3000:]
    assert all("ValueError: a causal (zigzag) split of 90 tokens" in line for line in ours)
    assert "[rank0]: Traceback" not in done.stderr and "[rank1]:" not in done.stderr
