"""The compute stream's head start for NCCL (RingCall.head_start_cycles): when a pause is made.

The pause itself (torch.cuda._sleep) and its effect are GPU matters (docs/performance.md); here
only the rule: off at 0, on before blocks of at least HEAD_START_MIN_FLOP, sized in cycles.
"""

from __future__ import annotations

import torch

from tokenring_xdit.ring.forward import RingCall
from tokenring_xdit.ring.head_start import _CYCLES_PER_US, HEAD_START_MIN_FLOP
from tokenring_xdit.ring.layout import get_layout
from tokenring_xdit.ring.schedules import NON_CAUSAL


def _call(us: float, layout: str = "bhsd") -> RingCall:
    return RingCall(
        schedule=NON_CAUSAL, kernel=None, kernel_key=None, layout=get_layout(layout), scale=1.0,
        chunks=1, joint_strategy="rear", fused_merge=True, head_start_us=us,
    )  # fmt: skip


def _bhsd(heads: int, tokens: int, dim: int) -> torch.Tensor:
    return torch.empty(1, heads, tokens, dim, device="meta")


def test_pause_before_long_blocks_only():
    call = _call(10.0)
    flux = _bhsd(24, 16896 // 2, 128)  # ring 2: 8448 local queries, ~8.8e11 FLOP per block
    assert call.head_start_cycles(flux, flux) == 10 * _CYCLES_PER_US
    pixart = _bhsd(16, 4096 // 4, 72)  # ring 4: 1024 local queries, ~4.8e9 FLOP: short
    assert 4 * 16 * 72 * 1024 * 1024 < HEAD_START_MIN_FLOP
    assert call.head_start_cycles(pixart, pixart) == 0


def test_zero_means_never():
    flux = _bhsd(24, 32768, 128)
    assert _call(0.0).head_start_cycles(flux, flux) == 0


def test_sizes_read_through_the_layout():
    call = _call(25.0, layout="bshd")
    q = torch.empty(1, 8448, 24, 128, device="meta")  # (b, s, h, d)
    assert call.head_start_cycles(q, q) == 25 * _CYCLES_PER_US
    assert call.head_start_cycles(q[:, :8], q[:, :8]) == 0  # 8 x 8 rows: nothing to wait for
