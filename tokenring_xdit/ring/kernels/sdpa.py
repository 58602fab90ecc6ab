"""torch's own attention ops as kernels: the CPU flash op, and on CUDA the SDPA flash, efficient
and cuDNN ops with their `_backward` ops.

cuDNN's backward additionally bakes the STRIDES of O and dO into a graph that torch caches under
a key of q/k/v's shapes and strides only: a later call with the same q/k/v but differently
strided O or dO reuses the plan and reads them wrongly (that, not the stand-in's values, made
the stand-in look wrong on H100). So cuDNN always gets O (or the stand-in) and dO laid out in
q's dimension order, as torch's own forward allocates O; that is a no-op in the ring's own calls.

A block with ONE query or ONE key never reaches cuDNN: torch's SDPA dispatcher does not give
cuDNN a key length of 1 (sdp_utils' check_cudnn_tensor_shapes), and every failure of cuDNN per
document segment on H200 had such a block (a 1-token document, or a 1-token piece of one at a
shard boundary; docs/kernels-cudnn-segments.md). torch flash runs those tiny blocks.
"""

from __future__ import annotations

import torch

from ...caches import Lru
from ..tensor_layout import Layout
from .standin import out_standin_bhsd
from .base import Kernel, from_bhsd, lse_bhs


def _bhsd_args(dout, q, k, v, out, delta, layout):
    dob, qb, kb, vb = (layout.to_bhsd(x) for x in (dout, q, k, v))
    ob = layout.to_bhsd(out) if out is not None else out_standin_bhsd(dob, delta)
    return dob, qb, kb, vb, ob


_NO_RNG = Lru(16)  # device -> its philox state (a few devices at most)


def no_rng(device) -> torch.Tensor:
    """The philox state the backward ops take; dropout is 0, so they never read it. One per
    device, made outside any capture (a packed call asked for one per segment: an allocation
    and a fill launch each); inside a capture a fresh one, as before."""
    device = torch.device(device)
    found = _NO_RNG.get(device)
    if found is not None:
        return found
    made = torch.zeros((), dtype=torch.int64, device=device)
    if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
        _NO_RNG.put(device, made)
    return made


# --- torch's CPU flash op ------------------------------------------------------------------


def _cpu_forward(q, k, v, scale, layout: Layout, causal):
    qb, kb, vb = (layout.to_bhsd(x) for x in (q, k, v))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        qb, kb, vb, 0.0, causal, scale=scale
    )[:2]
    return layout.from_bhsd(out), lse_bhs(lse, *qb.shape[:3])


def _cpu_backward(dout, q, k, v, out, lse, delta, scale, layout: Layout, causal):
    dob, qb, kb, vb, ob = _bhsd_args(dout, q, k, v, out, delta, layout)
    grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        dob, qb, kb, vb, ob, lse, 0.0, causal, scale=scale
    )
    return from_bhsd(layout, grads)


# --- CUDA: SDPA flash, efficient, cuDNN ------------------------------------------------------


def flash_forward(q, k, v, scale, layout: Layout, causal):
    qb, kb, vb = (layout.to_bhsd(x) for x in (q, k, v))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention(
        qb, kb, vb, 0.0, causal, False, scale=scale
    )[:2]
    return layout.from_bhsd(out), lse_bhs(lse, *qb.shape[:3])


def flash_backward(dout, q, k, v, out, lse, delta, scale, layout: Layout, causal):
    dob, qb, kb, vb, ob = _bhsd_args(dout, q, k, v, out, delta, layout)
    rng = no_rng(q.device)
    grads = torch.ops.aten._scaled_dot_product_flash_attention_backward(
        dob, qb, kb, vb, ob, lse.contiguous(), None, None, qb.shape[2], kb.shape[2], 0.0, causal,
        rng, rng, scale=scale,
    )  # fmt: skip
    return from_bhsd(layout, grads)


def _efficient_forward(q, k, v, scale, layout: Layout, causal):
    qb, kb, vb = (layout.to_bhsd(x) for x in (q, k, v))
    out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
        qb, kb, vb, None, True, 0.0, causal, scale=scale
    )[:2]
    return layout.from_bhsd(out), lse_bhs(lse, *qb.shape[:3])


def _one_token_side(q: torch.Tensor, k: torch.Tensor, layout: Layout) -> bool:
    """A block with one query or one key (module docstring: not for cuDNN)."""
    return min(q.shape[layout.seq_dim], k.shape[layout.seq_dim]) == 1


def _cudnn_forward(q, k, v, scale, layout: Layout, causal):
    if _one_token_side(q, k, layout):
        return flash_forward(q, k, v, scale, layout, causal)
    return cudnn_op_forward(q, k, v, scale, layout, causal)


def cudnn_op_forward(q, k, v, scale, layout: Layout, causal):
    """torch's cuDNN attention op itself, whatever the block (benchmarks/diagnostics)."""
    qb, kb, vb = (layout.to_bhsd(x) for x in (q, k, v))
    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
        qb, kb, vb, None, True, 0.0, causal, False, scale=scale
    )[:2]
    return layout.from_bhsd(out), lse_bhs(lse, *qb.shape[:3])


def _matching_strides(q: torch.Tensor, shape) -> tuple[int, ...]:
    """Dense strides for `shape` in q's dimension order (how torch's cuDNN forward lays out O)."""
    order = sorted(range(q.dim()), key=lambda i: q.stride(i))  # innermost first, stable
    strides, step = [0] * q.dim(), 1
    for i in order:
        strides[i] = step
        step *= shape[i]
    return tuple(strides)


def _with_strides(x: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """x itself when it already has `strides` (sizes of 1 ignored), else a copy that has them."""
    if all(n == 1 or a == b for n, a, b in zip(x.shape, x.stride(), strides, strict=True)):
        return x
    return torch.empty_strided(x.shape, strides, dtype=x.dtype, device=x.device).copy_(x)


def _cudnn_backward(dout, q, k, v, out, lse, delta, scale, layout: Layout, causal):
    if _one_token_side(q, k, layout):
        return flash_backward(dout, q, k, v, out, lse, delta, scale, layout, causal)
    return cudnn_op_backward(dout, q, k, v, out, lse, delta, scale, layout, causal)


def cudnn_op_backward(dout, q, k, v, out, lse, delta, scale, layout: Layout, causal):
    """torch's cuDNN attention backward op itself, whatever the block (benchmarks/diagnostics)."""
    qb, kb, vb, dob = (layout.to_bhsd(x) for x in (q, k, v, dout))
    # O and dO in q's order: torch caches cuDNN's plan by q/k/v strides only (module docstring)
    strides = _matching_strides(qb, dob.shape)
    dob = _with_strides(dob, strides)
    if out is not None:
        ob = _with_strides(layout.to_bhsd(out), strides)
    else:
        ob = out_standin_bhsd(dob, delta, strides)
    rng = no_rng(q.device)
    # cuDNN's stats tensor is (b, h, s, 1), as its forward returns it
    grads = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        dob, qb, kb, vb, ob, lse.unsqueeze(-1).contiguous(), rng, rng, None, None, None,
        qb.shape[2], kb.shape[2], 0.0, causal, scale=scale,
    )  # fmt: skip
    return from_bhsd(layout, grads)


CPU_FLASH = Kernel("cpu_flash", _cpu_forward, _cpu_backward, True, packed_as="masked")
TORCH_FLASH = Kernel("torch_flash", flash_forward, flash_backward, False, half_only=True)
# No ring backward: the efficient op's backward gave wrong gradients even with the real O (H100,
# torch 2.11); training runs torch flash (same attention, exact) in its place.
TORCH_EFFICIENT = Kernel("torch_efficient", _efficient_forward, None, False, train_as="torch_flash")
CUDNN = Kernel(
    "cudnn", _cudnn_forward, _cudnn_backward, False, half_only=True,
    # Packed documents: cuDNN per segment once failed its exactness check on H200; every
    # failing case had a one-key block, which now goes to torch flash (module docstring). With
    # that, tests/gpu/test_gpu_packed.py's cuDNN-per-segment cases pass on 4 x H200 (pairs and
    # every rank's loops, both layouts; docs/kernels-cudnn-segments.md). Packed `auto` runs it
    # where the cost model predicts it faster (few segments per rank: registry.auto_doc_kernel).
)  # fmt: skip
