"""GQA / MQA inside the ring: fewer K/V heads than query heads, in one place.

K/V never travel in TokenRing, so they stay home with their own head count; the query (and, in
the backward, dO, lse, delta and the dQ partial) travels with all its heads, as it does without
GQA. Only the per-block kernel sees both head counts, so GQA is a wrapper around it: query head
i uses K/V head i // g (g = q heads / K/V heads; the convention of flash-attn and of
transformers' `repeat_kv`).

- A kernel that takes fewer K/V heads itself (flash-attn, torch's CPU and CUDA flash ops) is
  called as is: its dK/dV come back in the K/V head count.
- Any other kernel gets K/V expanded to the query's head count for that block only (a local
  copy, never sent), and the backward sums the expanded dK/dV over each group of g heads (fp32),
  so dK/dV come back in the K/V head count too.

Which of the two a kernel is, is found once per kernel, device, dtype and head size by running
it on a tiny GQA input and comparing with the expanded call (`_native`); the probe runs where
the kernel is chosen, before any ring step (never inside a CUDA-graph capture).
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from dataclasses import dataclass

import torch

from .backward_kernels import KernelPair
from .kernels import BlockKernel, KeyedKernel
from .layout import BHSD, Layout

__all__ = ["kv_groups", "expand_kv", "fold_kv_grad", "gqa_kernel", "gqa_pair"]

_HALF = (torch.float16, torch.bfloat16)


def kv_groups(q: torch.Tensor, k: torch.Tensor, layout: Layout) -> int:
    """Query heads per K/V head (1: multi-head attention). The input check has made sure the
    K/V head count divides the query head count."""
    return q.shape[layout.head_dim] // k.shape[layout.head_dim]


def expand_kv(x: torch.Tensor, groups: int, layout: Layout) -> torch.Tensor:
    """K or V with each head repeated `groups` times, next to each other (h_kv -> h_kv * g)."""
    if groups == 1:
        return x
    hd = layout.head_dim
    shape = list(x.shape)
    shape.insert(hd + 1, groups)
    return x.unsqueeze(hd + 1).expand(shape).flatten(hd, hd + 1)


def fold_kv_grad(dx: torch.Tensor, groups: int, layout: Layout, dtype: torch.dtype):
    """dK or dV of expanded K/V summed over each group of `groups` heads (in fp32), in `dtype`."""
    if groups == 1:
        return dx.to(dtype)
    hd = layout.head_dim
    heads = dx.shape[hd] // groups
    return dx.float().unflatten(hd, (heads, groups)).sum(hd + 1).to(dtype)


# --- inference: block kernels (q, k, v, scale, layout) -> (out, lse) -------------------------


@dataclass(frozen=True)
class _ExpandedKernel:
    kernel: BlockKernel

    def __call__(self, q, k, v, scale: float, layout: Layout):
        g = kv_groups(q, k, layout)
        return self.kernel(q, expand_kv(k, g, layout), expand_kv(v, g, layout), scale, layout)


def gqa_kernel(
    kernel: BlockKernel, key: Hashable | None, device: torch.device, dtype, d_qk: int, d_v: int
) -> tuple[BlockKernel, Hashable | None]:
    """(kernel, graph key) for a call with fewer K/V heads than query heads."""
    if _native(("fwd", kernel), device.type, device.index, dtype, d_qk, d_v):
        return kernel, key
    wrapped = _ExpandedKernel(kernel)
    new_key = None if key is None else ("gqa-expanded", key)
    return (KeyedKernel(wrapped, new_key) if new_key is not None else wrapped), new_key


# --- training: kernel pairs (forward with causal, backward with delta) -----------------------


@dataclass(frozen=True)
class _ExpandedForward:
    forward: object

    def __call__(self, q, k, v, scale, layout, causal):
        g = kv_groups(q, k, layout)
        ke, ve = expand_kv(k, g, layout), expand_kv(v, g, layout)
        return self.forward(q, ke, ve, scale, layout, causal)


@dataclass(frozen=True)
class _ExpandedBackward:
    backward: object

    def __call__(self, dout, q, k, v, out, lse, delta, scale, layout, causal):
        g = kv_groups(q, k, layout)
        ke, ve = expand_kv(k, g, layout), expand_kv(v, g, layout)
        dq, dk, dv = self.backward(dout, q, ke, ve, out, lse, delta, scale, layout, causal)
        return dq, fold_kv_grad(dk, g, layout, k.dtype), fold_kv_grad(dv, g, layout, v.dtype)


def gqa_pair(pair: KernelPair, device: torch.device, dtype, d_qk: int, d_v: int) -> KernelPair:
    """The pair for a call with fewer K/V heads than query heads: `pair` itself where its kernels
    take them, else one that expands K/V per block and folds dK/dV back."""
    if _native(("pair", pair), device.type, device.index, dtype, d_qk, d_v):
        return pair
    return KernelPair(
        pair.name,
        _ExpandedForward(pair.forward),
        _ExpandedBackward(pair.backward),
        pair.deterministic,
    )


# --- the probe --------------------------------------------------------------------------------


@functools.cache
def _native(what: tuple, device_type: str, index, dtype, d_qk: int, d_v: int) -> bool:
    """Does the kernel (what = ("fwd", kernel) or ("pair", KernelPair)) take 4 query heads
    against 2 K/V heads and give what the expanded call gives (dK/dV in 2 heads)?"""
    device = torch.device(device_type, index) if index is not None else torch.device(device_type)
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(heads: int, d: int) -> torch.Tensor:
        return torch.randn(1, heads, 16, d, generator=gen).to(device, dtype)

    q, k, v, do = rand(4, d_qk), rand(2, d_qk), rand(2, d_v), rand(4, d_v)
    scale = d_qk**-0.5
    ke, ve = expand_kv(k, 2, BHSD), expand_kv(v, 2, BHSD)
    kind, fn = what
    try:
        if kind == "fwd":
            got, want = fn(q, k, v, scale, BHSD), fn(q, ke, ve, scale, BHSD)
        else:
            out, lse = fn.forward(q, ke, ve, scale, BHSD, True)
            delta = (do.float() * out.float()).sum(-1)
            args = (do, q, k, v, out, lse, delta, scale, BHSD, True)
            got = (*fn.forward(q, k, v, scale, BHSD, True), *fn.backward(*args))
            want = (out, lse, *_ExpandedBackward(fn.backward)(*args))
    except (RuntimeError, ValueError, TypeError, IndexError, NotImplementedError, ImportError):
        return False
    tol = 3e-2 if dtype in _HALF else 1e-4
    return all(
        a.shape == b.shape and torch.allclose(a.float(), b.float(), atol=tol, rtol=tol)
        for a, b in zip(got, want, strict=True)
    )
