"""The Triton source of standin.py's two passes; imported only once a pass asks for it."""

import triton
import triton.language as tl

from ..merge.fused_triton import rows_cols


@triton.jit
def _at(p, ib, ih, rows, cols, s_b, s_h, s_s, s_d):
    """The tile's elements of a (b, h, s, d) view at `p` with those strides. Inlined."""
    return p + ib * s_b + ih * s_h + rows[:, None] * s_s + cols[None, :] * s_d


@triton.jit
def rowdot(
    a, b, out, H, S, D,
    sa_b, sa_h, sa_s, sa_d, sb_b, sb_h, sb_s, sb_d, so_b, so_h, so_s,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    ib, ih, rows, cols, row_ok, mask = rows_cols(H, S, D, BLOCK_S, BLOCK_D)
    xa = tl.load(_at(a, ib, ih, rows, cols, sa_b, sa_h, sa_s, sa_d), mask=mask, other=0.0)
    xa = xa.to(tl.float32)
    xb = tl.load(_at(b, ib, ih, rows, cols, sb_b, sb_h, sb_s, sb_d), mask=mask, other=0.0)
    xb = xb.to(tl.float32)
    tl.store(out + ib * so_b + ih * so_h + rows * so_s, tl.sum(xa * xb, axis=1), mask=row_ok)


@triton.jit
def standin(
    do, delta, x, H, S, D,
    sd_b, sd_h, sd_s, sd_d, sl_b, sl_h, sl_s, sx_b, sx_h, sx_s, sx_d,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    ib, ih, rows, cols, row_ok, mask = rows_cols(H, S, D, BLOCK_S, BLOCK_D)
    g = tl.load(_at(do, ib, ih, rows, cols, sd_b, sd_h, sd_s, sd_d), mask=mask, other=0.0)
    g = g.to(tl.float32)
    dl = tl.load(delta + ib * sl_b + ih * sl_h + rows * sl_s, mask=row_ok, other=0.0)
    norm2 = tl.sum(g * g, axis=1)
    c = tl.where(norm2 > 0.0, dl / tl.where(norm2 > 0.0, norm2, 1.0), 0.0)
    x_at = _at(x, ib, ih, rows, cols, sx_b, sx_h, sx_s, sx_d)
    tl.store(x_at, (g * c[:, None]).to(x.dtype.element_ty), mask=mask)
