"""delta = rowsum(dO * O) and the stand-in for O that a travelling query block's backward reads.

The SDPA-style backward kernels (cuDNN, torch flash, flash-attn, torch's CPU flash) read the
forward output O only through D = rowsum(dO * O). A query block away from its owner has dO but
not O, so it gets X = dO * (delta / |dO|^2) per row: rowsum(dO * X) = delta, and X costs no
transfer (delta is one fp32 per row instead of a row of O).

Both passes read their inputs once, do fp32 math and write once: on CUDA one Triton kernel each
(no fp32 copy of dO or O, no dtype round trip), elsewhere torch ops (exact for fp32/fp64).
Rounding X to a half type changes its row sum by at most ~2^-9 of |delta| (every term has
delta's sign), the same order as rounding the real O to that type.
"""

from __future__ import annotations

import functools

import torch

from ..merge.fused import builds

__all__ = ["row_delta_bhsd", "out_standin_bhsd"]


@functools.cache
def _kernels():
    from .standin_triton import rowdot, standin  # imports triton: only once a pass asks for it

    return rowdot, standin


@functools.cache
def _triton_ok() -> bool:
    return builds(_kernels)


def _use_triton(x: torch.Tensor) -> bool:
    return x.is_cuda and x.dtype in (torch.float16, torch.bfloat16, torch.float32) and _triton_ok()


def _launch(kernel: int, a: torch.Tensor, b: torch.Tensor, res: torch.Tensor) -> None:
    """Pass `kernel` (0: rowdot, 1: standin) over the rows of (b, h, s, d) `a` and `b`, writing
    `res`: a program per (batch x head, block of rows)."""
    bsz, h, s, d = a.shape
    block_d = max(16, 1 << (d - 1).bit_length())
    block_s = max(1, min(128, 4096 // block_d))
    grid = (bsz * h, (s + block_s - 1) // block_s)
    _kernels()[kernel][grid](
        a, b, res, h, s, d, *a.stride(), *b.stride(), *res.stride(),
        BLOCK_S=block_s, BLOCK_D=block_d,
    )  # fmt: skip


def row_delta_bhsd(dout: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """rowsum(dout * out) of two (b, h, s, d) views (any strides), as (b, h, s) fp32."""
    b, h, s, d = dout.shape
    if not _use_triton(dout) or s == 0:
        acc = torch.float64 if dout.dtype == torch.float64 else torch.float32
        return (dout.to(acc) * out.to(acc)).sum(-1).float()
    res = torch.empty(b, h, s, dtype=torch.float32, device=dout.device)
    _launch(0, dout, out, res)
    return res


def out_standin_bhsd(
    dout: torch.Tensor, delta: torch.Tensor, strides: tuple[int, ...] | None = None
) -> torch.Tensor:
    """X (b, h, s, d) in dout's dtype with rowsum(dout * X) = delta (b, h, s) fp32.

    `strides`: X's strides (a kernel whose plan depends on O's strides gets the ones it expects);
    default: dout's when dout is dense, else contiguous.
    """
    x = (
        torch.empty_strided(dout.shape, strides, dtype=dout.dtype, device=dout.device)
        if strides is not None
        else torch.empty_like(dout)
    )
    b, h, s, d = dout.shape
    if s == 0:
        return x
    if not _use_triton(dout):
        acc = torch.float64 if dout.dtype == torch.float64 else torch.float32
        do = dout.to(acc)
        norm2 = (do * do).sum(-1, keepdim=True)
        c = torch.where(norm2 > 0, delta.to(acc).unsqueeze(-1) / norm2, torch.zeros_like(norm2))
        return x.copy_(do * c)
    _launch(1, dout, delta, x)
    return x
