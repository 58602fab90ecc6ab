"""The training loops of a whole ring as threads of one process (tests/thread_ring.py), on CPU:
the same check the GPU test runs with cuDNN, here with the CPU pairs (fp32 vs exact fp64)."""

from __future__ import annotations

import pytest
import torch

from tests.thread_ring import ring_case
from tokenring_xdit.ring.kernels import PAIRS
from tokenring_xdit.ring.layout import BHSD, BSHD

BF16_TOL = {"out": 2e-2, "dq": 6e-2, "dk": 6e-2, "dv": 6e-2}  # tests/distributed/test_training


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("name", ["cpu_flash", "math"])
def test_thread_ring_matches_exact(n, causal, name):
    lens = [3, 5, 4, 6][:n] if causal else [5, 7, 3, 6][:n]
    layout = BSHD if n % 2 else BHSD
    errs = ring_case(n, causal, lens, 2, 2, 40, torch.float32, "cpu", PAIRS[name], layout, seed=n)
    assert max(errs.values()) <= 2e-5, errs


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("name", ["cpu_flash", "math"])
def test_thread_ring_held_back_own_block_matches_exact(n, causal, name):
    """RingConfig.train_hold_back: the own block's head pieces at step 0, its tail behind the
    last return (ring/diagonal.py); out/dq/dk/dv as exact as without."""
    lens = [3, 5, 4, 6][:n] if causal else [5, 7, 3, 6][:n]
    layout = BSHD if n % 2 else BHSD
    errs = ring_case(n, causal, lens, 2, 2, 40, torch.float32, "cpu", PAIRS[name], layout,
                     seed=10 + n, hold_back=True)  # fmt: skip
    assert max(errs.values()) <= 2e-5, errs


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_thread_ring_held_back_bf16_within_tolerance(n, causal):
    """bf16 inputs: the split's extra terms are summed in fp32 (one rounding, as without it),
    so the errors vs fp64 stay within the training tests' bf16 bounds (at these sizes the max
    error of either loop moves by up to ~1.7x from seed to seed: rounding of single elements)."""
    lens = [48, 40, 56][:n]
    args = (n, causal, lens, 1, 2, 64, torch.bfloat16, "cpu", PAIRS["cpu_flash"], BSHD)
    held = ring_case(*args, seed=3, hold_back=True)
    for what, err in held.items():
        assert err <= BF16_TOL[what], (what, held)
