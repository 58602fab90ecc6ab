"""One-pass merge of two attention partials on CUDA (Triton), fp32 math.

    lse = logaddexp(lse_a, lse_b);  out = out_a * exp(lse_a - lse) + out_b * exp(lse_b - lse)

Reads both partials once and writes the result once, in whatever dtype the destination has
(fp32 for an accumulator, the caller's dtype for the final result), where the torch form takes
five kernels and two fp32 temporaries. Any (b, h, s, d) strides: both layouts are views of it.

Memory-bound, so what matters is the width of each load. Triton proves alignment from what it
sees: a head size like 72 or a row stride like 72 passed as a plain integer proves nothing, and
every access became a 2-byte one (76 us for a 57 MB merge on H200, about 0.75 TB/s in a
PixArt profile). So the head size is a compile-time constant and the b/h/s strides arrive
divided by `VEC` (multiplied back inside), which proves `VEC`-element alignment: 16-byte
accesses wherever the tensors allow them.
"""

from __future__ import annotations

import functools
import math

import torch


@functools.cache
def _kernel():
    from .fused_triton import merge2  # imports triton: only once a merge asks for the kernel

    return merge2


def builds(make) -> bool:
    """Whether a Triton kernel builder works here (False: no triton, or no GPU backend)."""
    try:
        make()
    except Exception:
        return False
    return True


@functools.cache
def available() -> bool:
    return builds(_kernel)


# The kernel's math is fp32 whatever the storage; fp64 partials keep the torch ops.
SERVED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

_ACCESS_BYTES = 16  # the widest load/store a thread issues
# Queries per program (4 warps), from 12 settings timed on H200 (merge_bandwidth.py, both storage
# orders): 16 is within 1 % of the best for Flux's d=128 merges (79-153 MB; 64, the old setting,
# 10-15 % slower) and within 6 % at PixArt 2048's d=72 one (58 MB). The smaller d=72 merge
# (29 MB) was fastest with 128 (6.3 vs 8.4 us): 0.2 % of its ring call, not worth a rule.
_ROWS_PER_PROGRAM = 16


def vector_width(d: int, *xs: torch.Tensor) -> int:
    """The widest access (in elements) every (b, h, s, d) view in `xs` allows: unit stride
    along d, every other stride, the head size and each start a multiple of it, at most 16
    bytes in the widest dtype."""
    common = d
    for x in xs:
        if x.stride(3) != 1 and d > 1:
            return 1
        start = x.data_ptr() // x.element_size()
        common = math.gcd(common, x.stride(0), x.stride(1), x.stride(2), start)
    vec = _ACCESS_BYTES // max(x.element_size() for x in xs)
    while common % vec:
        vec //= 2
    return vec


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
    *,
    block_s: int | None = None,
    num_warps: int = 4,
) -> None:
    """out/lse_out <- merge of (a, lse_a) and (b, lse_b); tensors are (b, h, s, d) views (any
    strides; out may alias a), lse (b, h, s) with unit stride along s. `block_s` (queries per
    program) and `num_warps`: tuning (benchmarks/diagnostics/merge_bandwidth.py)."""
    bsz, heads, seq, d = a.shape
    if seq == 0:
        return
    for lse in (lse_out, lse_a, lse_b):
        assert lse.stride(2) == 1
    vec = vector_width(d, out, a, b)
    block_d = max(16, 1 << (d - 1).bit_length())
    block_s = block_s or _ROWS_PER_PROGRAM
    grid = (bsz * heads, (seq + block_s - 1) // block_s)

    def strides(x: torch.Tensor) -> tuple[int, ...]:
        return (*(x.stride(i) // vec for i in range(3)), x.stride(3))

    _kernel()[grid](
        out, lse_out, a, lse_a, b, lse_b, heads, seq,
        *strides(out), *strides(a), *strides(b),
        lse_out.stride(0), lse_out.stride(1), lse_a.stride(0), lse_a.stride(1),
        lse_b.stride(0), lse_b.stride(1),
        D=d, VEC=vec, BLOCK_S=block_s, BLOCK_D=block_d, num_warps=num_warps,
    )  # fmt: skip
