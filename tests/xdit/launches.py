"""The CPU launches the xDiT test files share (one per layout, cached for the pytest session).

Each launch is a set of gloo ranks running `workers.run_xdit` (CPU mode, fp32); CI has 2 cores, so
every case of test_usp.py, test_long_ctx.py and test_pipelines.py for a layout comes out of the
same launch.
"""

from __future__ import annotations

import functools
import importlib.util

import numpy as np
import pytest

from tests.harness import run_ranks, values
from tests.xdit import workers


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


CPU_MODE_MARKS = [
    pytest.mark.skipif(
        importlib.util.find_spec("triton") is None,
        reason="CPU mode needs triton (pip install 'tokenring-xdit[cpu]')",
    ),
    # With a GPU, CPU mode calls straight through to xfuser: these tests run on CPU only.
    pytest.mark.skipif(_has_gpu(), reason="CPU-mode tests run on a machine without a GPU"),
]

# layout -> (ulysses, ring)
LAYOUTS = {"ring2": (1, 2), "ring4": (1, 4), "ulysses2xring2": (2, 2)}
PIPELINE_LAYOUTS = ("ring2", "ulysses2xring2")
FP32_TOL = 1e-5  # attention outputs (|out| < ~3), against fp64 exact attention
TIMEOUT = 300


@functools.cache
def cpu_launch(layout: str) -> tuple[dict, ...]:
    """Every rank's results for one layout: USP and long-context cases, TokenRing and xDiT's
    own ring; the pipelines too for the layouts in PIPELINE_LAYOUTS."""
    ulysses, ring = LAYOUTS[layout]
    parts = ("usp", "long_ctx") + (("pixart", "flux") if layout in PIPELINE_LAYOUTS else ())
    spec = dict(
        device="cpu",
        dtype="float32",
        ulysses=ulysses,
        ring=ring,
        impls=(workers.TOKEN_RING, workers.DEFAULT),
        parts=parts,
    )
    return tuple(values(run_ranks(workers.run_xdit, ulysses * ring, spec, timeout=TIMEOUT)))


def launch(spec: dict, world_size: int, env: dict | None = None) -> list[dict]:
    return values(run_ranks(workers.run_xdit, world_size, spec, timeout=TIMEOUT, env=env))


def part(result: dict, name: str) -> dict:
    """One part of one rank's results; a part that raised fails the test with its traceback."""
    got = result[name]
    if "error" in got:
        raise AssertionError(f"rank {result['rank']} part {name!r}: {got['error']}\n{got['trace']}")
    return got


def max_err(out: np.ndarray, ref) -> float:
    ref = np.asarray(ref, dtype=np.float64)
    assert out.shape == ref.shape, f"shape {out.shape} != reference {ref.shape}"
    return float(np.abs(out.astype(np.float64) - ref).max())
