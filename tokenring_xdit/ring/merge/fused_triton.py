"""The Triton source of the fused merge (fused.py), and the tile helper the stand-in kernels
share; imported only once a kernel is asked for, so importing the package needs no triton."""

import triton
import triton.language as tl


@triton.jit
def rows_cols(H, S, D, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program's tile of a (b, h, s, d) tensor, programs being (b * h, blocks of BLOCK_S
    queries): batch, head, rows, columns, rows in range, elements in range. Inlined."""
    pid_bh, pid_s = tl.program_id(0), tl.program_id(1)
    ib, ih = pid_bh // H, pid_bh % H
    rows = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    cols = tl.arange(0, BLOCK_D)
    row_ok = rows < S
    return ib, ih, rows, cols, row_ok, row_ok[:, None] & (cols[None, :] < D)


@triton.jit
def merge2(
    out, lse_out, a, la, b, lb, H, S,
    so_b, so_h, so_s, so_d, sa_b, sa_h, sa_s, sa_d, sb_b, sb_h, sb_s, sb_d,
    slo_b, slo_h, sla_b, sla_h, slb_b, slb_h,
    D: tl.constexpr, VEC: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    # b/h/s strides are in units of VEC elements; d strides in elements (1 when VEC > 1)
    ib, ih, rows, cols, row_ok, mask = rows_cols(H, S, D, BLOCK_S, BLOCK_D)
    lse_a = tl.load(la + ib * sla_b + ih * sla_h + rows, mask=row_ok, other=float("-inf"))
    lse_b = tl.load(lb + ib * slb_b + ih * slb_h + rows, mask=row_ok, other=float("-inf"))
    top = tl.maximum(lse_a, lse_b)
    top = tl.where(top == float("-inf"), 0.0, top)  # two empty partials stay empty
    wa, wb = tl.exp(lse_a - top), tl.exp(lse_b - top)
    total = wa + wb
    lse = top + tl.log(total)
    total = tl.where(total == 0.0, 1.0, total)
    a_at = (ib * sa_b + ih * sa_h) * VEC + (rows * sa_s * VEC)[:, None] + cols[None, :] * sa_d
    b_at = (ib * sb_b + ih * sb_h) * VEC + (rows * sb_s * VEC)[:, None] + cols[None, :] * sb_d
    o_at = (ib * so_b + ih * so_h) * VEC + (rows * so_s * VEC)[:, None] + cols[None, :] * so_d
    xa = tl.load(a + a_at, mask=mask, other=0.0).to(tl.float32)
    xb = tl.load(b + b_at, mask=mask, other=0.0).to(tl.float32)
    res = xa * (wa / total)[:, None] + xb * (wb / total)[:, None]
    # lse_out aliases lse_a in every in-place merge (out aliases a too). When a row of the
    # tile spans several warps (e.g. d=72: warpsPerCTA [1, 4] in the TTGIR), each warp loads
    # lse_a itself, so without this barrier one warp can store lse_out[i] before another
    # has loaded lse_a[i], and weigh its columns with the new lse (seen on 4xH200).
    tl.debug_barrier()
    tl.store(out + o_at, res.to(out.dtype.element_ty), mask=mask)
    tl.store(lse_out + ib * slo_b + ih * slo_h + rows, lse, mask=row_ok)
