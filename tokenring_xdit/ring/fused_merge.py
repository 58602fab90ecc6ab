"""One-pass merge of two attention partials on CUDA (Triton), fp32 math.

    lse = logaddexp(lse_a, lse_b);  out = out_a * exp(lse_a - lse) + out_b * exp(lse_b - lse)

Reads both partials once and writes the result once, in whatever dtype the destination has
(fp32 for an accumulator, the caller's dtype for the final result), where the torch form takes
five kernels and two fp32 temporaries. Any (b, h, s, d) strides: both layouts are views of it.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def merge2(
        out,
        lse_out,
        a,
        la,
        b,
        lb,
        H,
        S,
        D,
        so_b,
        so_h,
        so_s,
        so_d,
        sa_b,
        sa_h,
        sa_s,
        sa_d,
        sb_b,
        sb_h,
        sb_s,
        sb_d,
        slo_b,
        slo_h,
        sla_b,
        sla_h,
        slb_b,
        slb_h,
        BLOCK_S: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        pid_bh, pid_s = tl.program_id(0), tl.program_id(1)
        ib, ih = pid_bh // H, pid_bh % H
        rows = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
        cols = tl.arange(0, BLOCK_D)
        row_ok = rows < S
        mask = row_ok[:, None] & (cols[None, :] < D)
        lse_a = tl.load(la + ib * sla_b + ih * sla_h + rows, mask=row_ok, other=float("-inf"))
        lse_b = tl.load(lb + ib * slb_b + ih * slb_h + rows, mask=row_ok, other=float("-inf"))
        top = tl.maximum(lse_a, lse_b)
        top = tl.where(top == float("-inf"), 0.0, top)  # two empty partials stay empty
        wa, wb = tl.exp(lse_a - top), tl.exp(lse_b - top)
        total = wa + wb
        lse = top + tl.log(total)
        total = tl.where(total == 0.0, 1.0, total)
        xa = tl.load(
            a + ib * sa_b + ih * sa_h + rows[:, None] * sa_s + cols[None, :] * sa_d,
            mask=mask,
            other=0.0,
        ).to(tl.float32)
        xb = tl.load(
            b + ib * sb_b + ih * sb_h + rows[:, None] * sb_s + cols[None, :] * sb_d,
            mask=mask,
            other=0.0,
        ).to(tl.float32)
        res = xa * (wa / total)[:, None] + xb * (wb / total)[:, None]
        # lse_out aliases lse_a in every in-place merge (out aliases a too). When a row of the
        # tile spans several warps (e.g. d=72: warpsPerCTA [1, 4] in the TTGIR), each warp loads
        # lse_a itself, so without this barrier one warp can store lse_out[i] before another
        # has loaded lse_a[i], and weigh its columns with the new lse (seen on 4xH200).
        tl.debug_barrier()
        tl.store(
            out + ib * so_b + ih * so_h + rows[:, None] * so_s + cols[None, :] * so_d,
            res.to(out.dtype.element_ty),
            mask=mask,
        )
        tl.store(lse_out + ib * slo_b + ih * slo_h + rows, lse, mask=row_ok)

    return merge2


@functools.cache
def available() -> bool:
    try:
        _kernel()
    except Exception:  # no triton, or no GPU backend for it
        return False
    return True


# The kernel's math is fp32 whatever the storage; fp64 partials keep the torch ops.
SERVED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def serves(partial: torch.Tensor) -> bool:
    """Whether partials like this one can take the Triton merge (the switch is the caller's:
    RingConfig.fused_merge)."""
    return partial.is_cuda and partial.dtype in SERVED_DTYPES and available()


def merge2_bhsd(
    out: torch.Tensor,
    lse_out: torch.Tensor,
    a: torch.Tensor,
    lse_a: torch.Tensor,
    b: torch.Tensor,
    lse_b: torch.Tensor,
) -> None:
    """out/lse_out <- merge of (a, lse_a) and (b, lse_b); tensors are (b, h, s, d) views (any
    strides; out may alias a), lse (b, h, s) with unit stride along s."""
    bsz, heads, seq, d = a.shape
    if seq == 0:
        return
    for lse in (lse_out, lse_a, lse_b):
        assert lse.stride(2) == 1
    block_d = max(16, 1 << (d - 1).bit_length())
    block_s = max(1, min(128, 8192 // block_d))
    grid = (bsz * heads, (seq + block_s - 1) // block_s)
    _kernel()[grid](
        out,
        lse_out,
        a,
        lse_a,
        b,
        lse_b,
        heads,
        seq,
        d,
        *out.stride(),
        *a.stride(),
        *b.stride(),
        lse_out.stride(0),
        lse_out.stride(1),
        lse_a.stride(0),
        lse_a.stride(1),
        lse_b.stride(0),
        lse_b.stride(1),
        BLOCK_S=block_s,
        BLOCK_D=block_d,
    )
