"""What a kernel record gets wrapped in: GQA (K/V expanded per block), packed documents (one
dense call per segment) and the swapped wire layout. Each wrapper takes any kernel; which one a
call needs is decided in registry.py (GQA: by the probe).

GQA / MQA: K/V never travel in TokenRing, so they stay home with their own head count; the query
(and, in the backward, dO, lse, delta and the dQ partial) travels with all its heads. Only the
per-block kernel sees both head counts: query head i uses K/V head i // g (g = q heads / K/V
heads; flash-attn's and transformers' `repeat_kv` convention). A kernel that takes fewer K/V
heads itself is called as is; any other gets K/V expanded to the query's head count for that
block only (a local copy, never sent), and its dK/dV summed over each group of g heads (fp32).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..layout import Layout
from .base import BlockKernel, Kernel, RowsSeen, empty_partial, merge_rows

# --- GQA ------------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class ExpandedBlock:
    """A block kernel (q, k, v, scale, layout) run on K/V expanded to the query's heads."""

    kernel: BlockKernel

    def __call__(self, q, k, v, scale: float, layout: Layout):
        g = kv_groups(q, k, layout)
        return self.kernel(q, expand_kv(k, g, layout), expand_kv(v, g, layout), scale, layout)


@dataclass(frozen=True)
class ExpandedForward:
    forward: Callable

    def __call__(self, q, k, v, scale, layout: Layout, mask):
        g = kv_groups(q, k, layout)
        ke, ve = expand_kv(k, g, layout), expand_kv(v, g, layout)
        return self.forward(q, ke, ve, scale, layout, mask)


@dataclass(frozen=True)
class ExpandedBackward:
    backward: Callable

    def __call__(self, dout, q, k, v, out, lse, delta, scale, layout: Layout, mask):
        g = kv_groups(q, k, layout)
        ke, ve = expand_kv(k, g, layout), expand_kv(v, g, layout)
        dq, dk, dv = self.backward(dout, q, ke, ve, out, lse, delta, scale, layout, mask)
        return dq, fold_kv_grad(dk, g, layout, k.dtype), fold_kv_grad(dv, g, layout, v.dtype)


# A record is frozen and its wrappers keep no state: every call's `prepare` asks for the same
# wrapped record, so it is made once (a dataclasses.replace per call was a quarter of a packed
# call's prepare; issue 42). Keyed by the record's value, bounded.
@functools.lru_cache(maxsize=64)
def expanded(kernel: Kernel) -> Kernel:
    """`kernel` on K/V expanded per block, its dK/dV folded back (same name and family)."""
    return _rewrapped(kernel, ExpandedForward, ExpandedBackward)


# --- packed documents: a dense kernel once per segment --------------------------------------


@dataclass(frozen=True)
class SegmentsForward:
    dense: Callable

    def __call__(self, q, k, v, scale, layout: Layout, mask):
        if isinstance(mask, bool):
            return self.dense(q, k, v, scale, layout, mask)
        out, lse = empty_partial(q, v, layout)
        seq, seen = layout.seq_slice, RowsSeen(q.shape[layout.seq_dim])
        for s in mask:
            qs, ks = slice(s.q0, s.q1), slice(s.k0, s.k1)
            o, block_lse = self.dense(seq(q, qs), seq(k, ks), seq(v, ks), scale, layout, s.causal)
            if seen.first(s.q0, s.q1):
                seq(out, qs).copy_(o)
                lse[:, :, qs] = block_lse
            else:  # a second key piece of the same query piece (documents layout)
                merge_rows(seq(out, qs), lse[:, :, qs], o, block_lse.float(), layout.lse_to_out)
        return out, lse


@dataclass(frozen=True)
class SegmentsBackward:
    dense: Callable

    def __call__(self, dout, q, k, v, out, lse, delta, scale, layout: Layout, mask):
        if isinstance(mask, bool):
            return self.dense(dout, q, k, v, out, lse, delta, scale, layout, mask)
        dq, dk, dv = (torch.zeros_like(x) for x in (q, k, v))
        seq = layout.seq_slice
        for s in mask:
            qs, ks = slice(s.q0, s.q1), slice(s.k0, s.k1)
            o = seq(out, qs) if out is not None else None
            d = delta[:, :, qs] if delta is not None else None
            args = (seq(dout, qs), seq(q, qs), seq(k, ks), seq(v, ks), o)
            g = self.dense(*args, lse[:, :, qs].contiguous(), d, scale, layout, s.causal)
            # key runs of documents are disjoint; add keeps it exact anyway
            for grad, x, sl in zip(g, (dq, dk, dv), (qs, ks, ks), strict=True):
                seq(x, sl).add_(grad)
        return dq, dk, dv


@functools.lru_cache(maxsize=64)  # (as `expanded`)
def segments_pair(dense: Kernel) -> Kernel:
    """`dense` called once per segment (the fallback for kernels without cu_seqlens)."""
    wrapped = _rewrapped(dense, SegmentsForward, SegmentsBackward)
    return dataclasses.replace(wrapped, name=f"{dense.name}+segments", segments=True)


def _rewrapped(kernel: Kernel, forward: type, backward: type) -> Kernel:
    return dataclasses.replace(
        kernel,
        forward=forward(kernel.forward),
        backward=backward(kernel.backward) if kernel.backward is not None else None,
        deterministic_backward=None,  # already chosen: `kernel.backward` is the one to wrap
    )


# --- the swapped wire layout ----------------------------------------------------------------


@dataclass(frozen=True)
class SwappedKernel:
    """A kernel for `declared`-layout tensors run on tensors of the other layout (the ring's
    wire layout when q is stored swapped, ring/layout.storage): views both ways, no copy."""

    fn: BlockKernel
    declared: Layout

    def __call__(self, q, k, v, scale: float, layout: Layout):
        out, lse = self.fn(*(x.transpose(1, 2) for x in (q, k, v)), scale, self.declared)
        return out.transpose(1, 2), lse
