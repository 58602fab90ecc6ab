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
    import triton
    import triton.language as tl

    @triton.jit
    def rowdot(
        a, b, out, H, S, D,
        sa_b, sa_h, sa_s, sa_d, sb_b, sb_h, sb_s, sb_d, so_b, so_h, so_s,
        BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        pid_bh, pid_s = tl.program_id(0), tl.program_id(1)
        ib, ih = pid_bh // H, pid_bh % H
        rows = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
        cols = tl.arange(0, BLOCK_D)
        row_ok = rows < S
        mask = row_ok[:, None] & (cols[None, :] < D)
        xa = tl.load(
            a + ib * sa_b + ih * sa_h + rows[:, None] * sa_s + cols[None, :] * sa_d,
            mask=mask, other=0.0,
        ).to(tl.float32)  # fmt: skip
        xb = tl.load(
            b + ib * sb_b + ih * sb_h + rows[:, None] * sb_s + cols[None, :] * sb_d,
            mask=mask, other=0.0,
        ).to(tl.float32)  # fmt: skip
        tl.store(out + ib * so_b + ih * so_h + rows * so_s, tl.sum(xa * xb, axis=1), mask=row_ok)

    @triton.jit
    def standin(
        do, delta, x, H, S, D,
        sd_b, sd_h, sd_s, sd_d, sl_b, sl_h, sl_s, sx_b, sx_h, sx_s, sx_d,
        BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        pid_bh, pid_s = tl.program_id(0), tl.program_id(1)
        ib, ih = pid_bh // H, pid_bh % H
        rows = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
        cols = tl.arange(0, BLOCK_D)
        row_ok = rows < S
        mask = row_ok[:, None] & (cols[None, :] < D)
        g = tl.load(
            do + ib * sd_b + ih * sd_h + rows[:, None] * sd_s + cols[None, :] * sd_d,
            mask=mask, other=0.0,
        ).to(tl.float32)  # fmt: skip
        dl = tl.load(delta + ib * sl_b + ih * sl_h + rows * sl_s, mask=row_ok, other=0.0)
        norm2 = tl.sum(g * g, axis=1)
        c = tl.where(norm2 > 0.0, dl / tl.where(norm2 > 0.0, norm2, 1.0), 0.0)
        tl.store(
            x + ib * sx_b + ih * sx_h + rows[:, None] * sx_s + cols[None, :] * sx_d,
            (g * c[:, None]).to(x.dtype.element_ty),
            mask=mask,
        )

    return rowdot, standin


@functools.cache
def _triton_ok() -> bool:
    return builds(_kernels)


def _use_triton(x: torch.Tensor) -> bool:
    return x.is_cuda and x.dtype in (torch.float16, torch.bfloat16, torch.float32) and _triton_ok()


def _grid(shape) -> tuple[tuple[int, int], int, int]:
    b, h, s, d = shape
    block_d = max(16, 1 << (d - 1).bit_length())
    block_s = max(1, min(128, 4096 // block_d))
    return (b * h, (s + block_s - 1) // block_s), block_s, block_d


def row_delta_bhsd(dout: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """rowsum(dout * out) of two (b, h, s, d) views (any strides), as (b, h, s) fp32."""
    b, h, s, d = dout.shape
    if not _use_triton(dout) or s == 0:
        acc = torch.float64 if dout.dtype == torch.float64 else torch.float32
        return (dout.to(acc) * out.to(acc)).sum(-1).float()
    res = torch.empty(b, h, s, dtype=torch.float32, device=dout.device)
    grid, block_s, block_d = _grid(dout.shape)
    _kernels()[0][grid](
        dout, out, res, h, s, d, *dout.stride(), *out.stride(), *res.stride(),
        BLOCK_S=block_s, BLOCK_D=block_d,
    )  # fmt: skip
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
    grid, block_s, block_d = _grid(dout.shape)
    _kernels()[1][grid](
        dout, delta, x, h, s, d, *dout.stride(), *delta.stride(), *x.stride(),
        BLOCK_S=block_s, BLOCK_D=block_d,
    )  # fmt: skip
    return x
