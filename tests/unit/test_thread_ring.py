"""The training loops of a whole ring as threads of one process (tests/thread_ring.py), on CPU:
the same check the GPU test runs with cuDNN, here with the CPU pairs (fp32 vs exact fp64)."""

from __future__ import annotations

import pytest
import torch

from tests.thread_ring import ring_case
from tokenring_xdit.ring.kernels import PAIRS, gqa_pair
from tokenring_xdit.ring.tensor_layout import BHSD, BSHD

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
    """RingConfig.train_hold_back: the own block's first heads at step 0, the rest behind the
    last return (ring/training/hold_back.py); out/dq/dk/dv as exact as without. MHA (2 heads), GQA
    (6 query heads on 3 K/V heads: 2 run first, 1 last) and MQA (1 K/V head: no split)."""
    lens = [3, 5, 4, 6][:n] if causal else [5, 7, 3, 6][:n]
    layout = BSHD if n % 2 else BHSD
    for h, h_kv in ((2, None), (6, 3), (4, 1)):
        pair = gqa_pair(PAIRS[name], torch.device("cpu"), torch.float32, 40, 40)
        errs = ring_case(n, causal, lens, 2, h, 40, torch.float32, "cpu", pair, layout,
                         seed=10 + n, hold_back=True, h_kv=h_kv)  # fmt: skip
        assert max(errs.values()) <= 2e-5, (h, h_kv, errs)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_thread_ring_held_back_bf16_within_tolerance(n, causal):
    """bf16 inputs: split by heads, no position gets another term (ring 2 keeps its sums in
    bf16, one rounding each), so the errors vs fp64 stay within the training tests' bf16
    bounds."""
    lens = [48, 40, 56][:n]
    args = (n, causal, lens, 1, 2, 64, torch.bfloat16, "cpu", PAIRS["cpu_flash"], BSHD)
    base = ring_case(*args, seed=3)
    held = ring_case(*args, seed=3, hold_back=True)
    for what, err in held.items():
        assert err <= BF16_TOL[what], (what, held)
        assert err <= 1.05 * base[what], (what, held, base)  # the same terms, the same sums


@pytest.mark.parametrize("hold_back", [False, True], ids=["whole", "held-back"])
def test_thread_ring_fp64_sums(hold_back):
    """BlockCall.acc = fp64, how the GPU tests measure the block kernels' own error: fp64
    inputs exact as with the default (which sums fp64 in fp64 too); fp32 inputs as exact, and
    the sums are not the default's (fp32) somewhere; bf16 inputs meet the GPU tests' bound
    (within 1.15x of the fp64-sum ring's error, or 4e-3)."""
    changed = []
    for n, causal in ((2, True), (3, True), (3, False), (4, True), (4, False)):
        lens = [48, 40, 56, 64][:n]
        args = (n, causal, lens, 1, 2, 64)
        wide = ring_case(*args, torch.float64, "cpu", PAIRS["math"], BSHD, seed=3,
                         hold_back=hold_back, acc=torch.float64)  # fmt: skip
        default = ring_case(*args, torch.float64, "cpu", PAIRS["math"], BSHD, seed=3,
                            hold_back=hold_back)  # fmt: skip
        assert wide == default and max(wide.values()) <= 2e-5, (n, causal, wide, default)
        rest = ("cpu", PAIRS["cpu_flash"], BSHD)
        own, got = (ring_case(*args, dtype, *rest, seed=3, hold_back=hold_back, acc=acc)
                    for dtype, acc in ((torch.float32, torch.float64),
                                       (torch.float32, torch.float32)))  # fmt: skip
        assert max(own.values()) <= 2e-5, (n, causal, own)
        changed.append(own != got)
        own, got = (ring_case(*args, torch.bfloat16, *rest, seed=3, hold_back=hold_back, acc=acc)
                    for acc in (torch.float64, torch.float32))  # fmt: skip
        for what, err in got.items():
            assert err <= max(1.15 * own[what], 4e-3), (n, causal, what, got, own)
    assert any(changed), "fp64 sums gave the fp32 sums' results everywhere"
