"""The compute stream's head start for NCCL (head_start_cycles): when a pause is made.

The pause itself (torch.cuda._sleep) and its effect are GPU matters (docs/performance.md); here
only the rule: off at 0, on before blocks of at least HEAD_START_MIN_FLOP, sized in cycles.
"""

from __future__ import annotations

import functools

import torch

from tokenring_xdit.ring.head_start import (
    _CYCLES_PER_US,
    HEAD_START_MIN_FLOP,
    head_start_cycles,
)
from tokenring_xdit.ring.tensor_layout import get_layout


def _rule(us: float, layout: str = "bhsd"):
    """head_start_cycles(q, k) for one setting and layout."""
    return functools.partial(head_start_cycles, us, get_layout(layout))


def _bhsd(heads: int, tokens: int, dim: int) -> torch.Tensor:
    return torch.empty(1, heads, tokens, dim, device="meta")


def test_pause_before_long_blocks_only():
    cycles = _rule(10.0)
    flux = _bhsd(24, 16896 // 2, 128)  # ring 2: 8448 local queries, ~8.8e11 FLOP per block
    assert cycles(flux, flux) == 10 * _CYCLES_PER_US
    pixart = _bhsd(16, 4096 // 4, 72)  # ring 4: 1024 local queries, ~4.8e9 FLOP: short
    assert 4 * 16 * 72 * 1024 * 1024 < HEAD_START_MIN_FLOP
    assert cycles(pixart, pixart) == 0


def test_zero_means_never():
    flux = _bhsd(24, 32768, 128)
    assert _rule(0.0)(flux, flux) == 0


def test_sizes_read_through_the_layout():
    cycles = _rule(25.0, layout="bshd")
    q = torch.empty(1, 8448, 24, 128, device="meta")  # (b, s, h, d)
    assert cycles(q, q) == 25 * _CYCLES_PER_US
    assert cycles(q[:, :8], q[:, :8]) == 0  # 8 x 8 rows: nothing to wait for
