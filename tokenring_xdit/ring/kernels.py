"""Per-block attention kernels that return a real log-sum-exp.

Contract of a block kernel: ``kernel(q, k, v, scale, layout) -> (out, lse)`` with q, k, v in
`layout`, out in the same layout and dtype as q, lse (b, h, s_q) fp32 in natural log. Kernels whose
lse is a placeholder (yunchang's TORCH_MATH / TORCH_CUDNN return zeros) are never used: a ring
merge with a fake lse is silently wrong.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

from .layout import BHSD, Layout

BlockKernel = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, float, Layout], tuple[torch.Tensor, torch.Tensor]
]

_HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class KeyedKernel:
    """A block kernel with a name that is stable across calls (and equal on every rank), so
    calls that use it can be captured and replayed as CUDA graphs."""

    fn: BlockKernel
    key: Hashable

    def __call__(self, q, k, v, scale: float, layout: Layout):
        return self.fn(q, k, v, scale, layout)


@dataclass(frozen=True)
class SwappedKernel:
    """A kernel for `declared`-layout tensors run on tensors of the other layout (the ring's
    wire layout when q is stored swapped, ring/layout.storage): views both ways, no copy."""

    fn: BlockKernel
    declared: Layout

    def __call__(self, q, k, v, scale: float, layout: Layout):
        out, lse = self.fn(*(x.transpose(1, 2) for x in (q, k, v)), scale, self.declared)
        return out.transpose(1, 2), lse


def lse_bhs(lse: torch.Tensor, batch: int, heads: int, seq: int) -> torch.Tensor:
    """A kernel's lse as (b, h, s) fp32: efficient pads it to a multiple of 32 queries, cuDNN
    may add a trailing 1, flash-style kernels give (b, h, s) already."""
    return lse.reshape(batch, heads, -1)[:, :, :seq].float()


def _lse_bhsd(lse: torch.Tensor, q_bhsd: torch.Tensor) -> torch.Tensor:
    b, h, s, _ = q_bhsd.shape
    return lse_bhs(lse, b, h, s)


def empty_block(q, k, v, layout: Layout) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The partial of an empty query or key block (no kernel takes those; torch's CPU flash
    kernel even dies of SIGFPE): zeros and lse = -inf, which the merge weighs as nothing."""
    s_q, s_k = q.shape[layout.seq_dim], k.shape[layout.seq_dim]
    if s_q and s_k:
        return None
    b, _, h, _ = layout.dims(q)
    out = layout.empty(b, s_q, h, v.shape[3], like=q).zero_()
    return out, torch.full((b, h, s_q), float("-inf"), dtype=torch.float32, device=q.device)


def run_block(kernel: BlockKernel, q, k, v, scale: float, layout: Layout):
    """kernel(q, k, v, scale, layout), except for empty blocks."""
    empty = empty_block(q, k, v, layout)
    return empty if empty is not None else kernel(q, k, v, scale, layout)


def cpu_flash(q, k, v, scale, layout):
    empty = empty_block(q, k, v, layout)
    if empty is not None:
        return empty
    qb, kb, vb = (layout.to_bhsd(x) for x in (q, k, v))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        qb, kb, vb, 0.0, False, scale=scale
    )[:2]
    return layout.from_bhsd(out), _lse_bhsd(lse, qb)


def torch_cudnn(q, k, v, scale, layout):
    qb, kb, vb = (layout.to_bhsd(x) for x in (q, k, v))
    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
        qb, kb, vb, None, True, 0.0, False, False, scale=scale
    )[:2]
    return layout.from_bhsd(out), _lse_bhsd(lse, qb)


def torch_flash(q, k, v, scale, layout):
    qb, kb, vb = (layout.to_bhsd(x) for x in (q, k, v))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention(qb, kb, vb, scale=scale)[:2]
    return layout.from_bhsd(out), _lse_bhsd(lse, qb)


def torch_efficient(q, k, v, scale, layout):
    qb, kb, vb = (layout.to_bhsd(x) for x in (q, k, v))
    out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
        qb, kb, vb, None, True, scale=scale
    )[:2]
    return layout.from_bhsd(out), _lse_bhsd(lse, qb)


def flash_attn(q, k, v, scale, layout):
    from flash_attn import flash_attn_func  # optional extra

    # flash-attn wants (b, s, h, d); transpose(1, 2) maps between the two layouts both ways.
    flip = layout is BHSD
    qs, ks, vs = (x.transpose(1, 2) if flip else x for x in (q, k, v))
    out, lse, _ = flash_attn_func(qs, ks, vs, softmax_scale=scale, return_attn_probs=True)
    return (out.transpose(1, 2) if flip else out), lse.float()


def math(q, k, v, scale, layout):
    """Exact fp32 attention with its lse; any device, any dtype (slow, for checks)."""
    qb, kb, vb = (layout.to_bhsd(x).float() for x in (q, k, v))
    scores = (qb @ kb.transpose(-1, -2)) * scale
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.exp(scores - lse.unsqueeze(-1)) @ vb
    return layout.from_bhsd(out.to(q.dtype)), lse


KERNELS: dict[str, BlockKernel] = {
    "flash_attn": flash_attn,
    "cudnn": torch_cudnn,
    "torch_flash": torch_flash,
    "torch_efficient": torch_efficient,
    "cpu_flash": cpu_flash,
    "math": math,
}

# Fastest first (cuDNN reaches 450-680 TFLOP/s on H200 vs 265-358 for torch flash).
_CUDA_ORDER = ("flash_attn", "cudnn", "torch_flash", "torch_efficient", "math")
_CPU_ORDER = ("cpu_flash", "math")


def has_flash_attn() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


@functools.cache
def _first_working(device: str, dtype: torch.dtype, d_qk: int, d_v: int) -> str:
    order = _CPU_ORDER if device == "cpu" else _CUDA_ORDER
    for name in order:
        if name == "flash_attn" and not has_flash_attn():
            continue
        if (
            device != "cpu"
            and dtype not in _HALF
            and name in ("flash_attn", "cudnn", "torch_flash")
        ):
            continue
        if _probe(KERNELS[name], device, dtype, d_qk, d_v):
            return name
    raise RuntimeError(f"no attention kernel with lse for {dtype} head size {d_qk} on {device}")


def _probe(kernel: BlockKernel, device: str, dtype: torch.dtype, d_qk: int, d_v: int) -> bool:
    """Run `kernel` once on a tiny input; compare with `math` so a kernel that runs but
    returns garbage for this head size is skipped too."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k = (torch.randn(1, 1, 16, d_qk, generator=gen).to(device, dtype) for _ in range(2))
    v = torch.randn(1, 1, 16, d_v, generator=gen).to(device, dtype)
    try:
        out, lse = kernel(q, k, v, d_qk**-0.5, BHSD)
    except (RuntimeError, NotImplementedError, ImportError, TypeError):
        return False
    ref_out, ref_lse = math(q, k, v, d_qk**-0.5, BHSD)
    tol = 1e-4 if dtype not in _HALF else 3e-2
    return (
        out.shape == ref_out.shape
        and lse.shape == ref_lse.shape
        and torch.allclose(lse, ref_lse, atol=tol, rtol=tol)
        and torch.allclose(out.float(), ref_out.float(), atol=tol, rtol=tol)
    )


def select_kernel(
    name: str, device: torch.device, dtype: torch.dtype, d_qk: int, d_v: int
) -> tuple[str, BlockKernel]:
    """Resolve a kernel name ("auto" = fastest that works for this device/dtype/head size)."""
    if name == "auto":
        name = _first_working(device.type, dtype, d_qk, d_v)
    try:
        return name, KERNELS[name]
    except KeyError:
        raise ValueError(
            f"unknown kernel {name!r}; use 'auto' or one of {sorted(KERNELS)}"
        ) from None
