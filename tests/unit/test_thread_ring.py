"""The training loops of a whole ring as threads of one process (tests/thread_ring.py), on CPU:
the same check the GPU test runs with cuDNN, here with the CPU pairs (fp32 vs exact fp64)."""

from __future__ import annotations

import pytest
import torch

from tests.thread_ring import ring_case
from tokenring_xdit.ring.kernels import PAIRS
from tokenring_xdit.ring.layout import BHSD, BSHD


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("name", ["cpu_flash", "math"])
def test_thread_ring_matches_exact(n, causal, name):
    lens = [3, 5, 4, 6][:n] if causal else [5, 7, 3, 6][:n]
    layout = BSHD if n % 2 else BHSD
    errs = ring_case(n, causal, lens, 2, 2, 40, torch.float32, "cpu", PAIRS[name], layout, seed=n)
    assert max(errs.values()) <= 2e-5, errs
