"""The compute stream's head start for a transfer that waits for the kernel before it.

A partial's send waits for the kernel that made it; the next attention kernel on the compute
stream is ready at the same moment and, first in line, takes every SM, so NCCL's transfer kernel
starts only as that kernel's last wave drains and the partial travels in the open. A pause of
a few microseconds on the compute stream (a sleeping one-thread kernel, captured in CUDA graphs
like any other) lets NCCL's blocks take their SMs first. Measured on 4 x H200 (docs/performance.md,
design decisions): NCCL time in the open per call 0.26-0.56 -> 0.04-0.08 ms at
16-64k tokens; calls 1-4 % faster at ring 2 from 16k tokens, up to 8 % at ring 4.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the rule below is pure Python: the planner models it without torch
    import torch

    from ..tensor_layout import Layout

__all__ = [
    "HEAD_START_MIN_FLOP",
    "block_pause_us",
    "head_start",
    "head_start_cycles",
    "ring_pause_us",
]

# torch.cuda._sleep counts SM clock cycles; H100/H200 boost clocks are ~1.7-2.0 GHz.
_CYCLES_PER_US = 1800
# The head start pauses only before blocks of at least this much work (~25 us on an H200):
# before shorter kernels the pause cost more than it saved (ring 4, PixArt 4096: +20 %).
HEAD_START_MIN_FLOP = 1e10


def ring_pause_us(configured: float, transport: str) -> float:
    """The head start a ring's loops use: the configured one on NCCL lanes (whose transfer
    kernels compete for SMs), none on the IPC transport's copy engines."""
    return configured if transport == "nccl" else 0.0


def head_start(us: float, layout: Layout, q: torch.Tensor, k: torch.Tensor) -> None:
    """Pause this stream before the block q x k (on CUDA, where head_start_cycles says so)."""
    cycles = head_start_cycles(us, layout, q, k)
    if cycles and q.is_cuda:
        import torch

        torch.cuda._sleep(cycles)


def head_start_cycles(us: float, layout: Layout, q: torch.Tensor, k: torch.Tensor) -> int:
    """The pause before the block q x k, in SM clock cycles: 0 when off, or where that kernel
    is too short for NCCL's late start to matter."""
    if us <= 0:
        return 0
    b, s_q, h, d = layout.dims(q)
    return int(block_pause_us(us, 4 * b * h * d * s_q * layout.dims(k)[1]) * _CYCLES_PER_US)


def block_pause_us(us: float, flop: float) -> float:
    """The pause before a block of `flop` (4 b h d s_q s_k) when the head start is `us`: none
    before blocks too short for NCCL's late start to matter."""
    return us if us > 0 and flop >= HEAD_START_MIN_FLOP else 0.0
