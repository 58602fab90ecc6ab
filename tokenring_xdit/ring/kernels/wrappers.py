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
from typing import NamedTuple

import torch

from ..tensor_layout import BHSD, Layout
from .base import BlockKernel, Kernel, empty_partial, merge_rows

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
# call's prepare). Keyed by the record's value, bounded.
@functools.lru_cache(maxsize=64)
def expanded(kernel: Kernel) -> Kernel:
    """`kernel` on K/V expanded per block, its dK/dV folded back (same name and family)."""
    return _rewrapped(kernel, ExpandedForward, ExpandedBackward)


# --- packed documents: a dense kernel once per segment --------------------------------------


class _Cut(NamedTuple):
    """One segment as the wrappers run it: its query and key rows, causality, and whether no
    earlier segment of the block wrote those query / key rows (copied, else merged / added)."""

    q: slice
    k: slice
    causal: bool
    q_first: bool
    k_first: bool


class _Cuts(NamedTuple):
    cuts: tuple[_Cut, ...]
    # every query (key) row is written by some segment, each segment's rows either all fresh
    # or all written before: the results need no zero / -inf start (the zigzag's diagonal
    # block, where every token is in one document)
    q_covered: bool
    k_covered: bool


def _firsts(rows: bytearray, a: int, b: int) -> tuple[bool, bool]:
    """(no row of [a, b) was written, all or none were); marks them written."""
    seen = rows[a:b].count(1)
    rows[a:b] = b"\x01" * (b - a)
    return seen == 0, seen in (0, b - a)


@functools.lru_cache(maxsize=256)  # masks come from the agreed plan: the same every call
def _cut(mask: tuple, s_q: int, s_k: int) -> _Cuts:
    """The cuts of a block's segments (slices, first writes and coverage), made once."""
    q_rows, k_rows = bytearray(s_q), bytearray(s_k)
    cuts, q_clean, k_clean = [], True, True
    for s in mask:
        if s.band is not None:  # (registry routes banded blocks to a kernel that takes them)
            raise NotImplementedError("a dense kernel run per segment cannot take a window's band")
        q_first, q_ok = _firsts(q_rows, s.q0, s.q1)
        k_first, k_ok = _firsts(k_rows, s.k0, s.k1)
        q_clean, k_clean = q_clean and q_ok, k_clean and k_ok
        cuts.append(_Cut(slice(s.q0, s.q1), slice(s.k0, s.k1), s.causal, q_first, k_first))
    return _Cuts(tuple(cuts), q_clean and 0 not in q_rows, k_clean and 0 not in k_rows)


def _start(x: torch.Tensor, covered: bool) -> torch.Tensor:
    """A gradient sum of x's shape: uninitialised where every row is written first, else 0."""
    return torch.empty_like(x) if covered else torch.zeros_like(x)


def _views(layout: Layout, bhsd: bool, *xs):
    """(the layout the dense kernel runs in, xs as views in it): (b, h, s, d) views where its
    ops take those (`Kernel.bhsd_ops`), else the caller's layout."""
    if not bhsd or layout.seq_dim == 2:
        return layout, xs
    return BHSD, tuple(None if x is None else layout.to_bhsd(x) for x in xs)


@dataclass(frozen=True)
class SegmentsForward:
    dense: Callable
    bhsd: bool = False  # cut the segments from (b, h, s, d) views (`Kernel.bhsd_ops`)

    def __call__(self, q, k, v, scale, layout: Layout, mask):
        if isinstance(mask, bool):
            return self.dense(q, k, v, scale, layout, mask)
        sd = layout.seq_dim
        cuts = _cut(tuple(mask), q.shape[sd], k.shape[sd])
        # where every row is copied before it is read, no zero / -inf start is needed
        out, lse = empty_partial(q, v, layout, filled=not cuts.q_covered)
        run, (qr, kr, vr, outr) = _views(layout, self.bhsd, q, k, v, out)
        seq = run.seq_slice
        for c in cuts.cuts:
            qkv = (seq(qr, c.q), seq(kr, c.k), seq(vr, c.k))
            o, block_lse = self.dense(*qkv, scale, run, c.causal)
            if c.q_first:
                seq(outr, c.q).copy_(o)
                lse[:, :, c.q] = block_lse
            else:  # a second key piece of the same query piece (documents layout)
                merge_rows(seq(outr, c.q), lse[:, :, c.q], o, block_lse.float(), run.lse_to_out)
        return out, lse


@dataclass(frozen=True)
class SegmentsBackward:
    dense: Callable
    bhsd: bool = False  # (as SegmentsForward's)

    def __call__(self, dout, q, k, v, out, lse, delta, scale, layout: Layout, mask):
        if isinstance(mask, bool):
            return self.dense(dout, q, k, v, out, lse, delta, scale, layout, mask)
        sd = layout.seq_dim
        cuts = _cut(tuple(mask), q.shape[sd], k.shape[sd])
        dq = _start(q, cuts.q_covered)
        dk, dv = _start(k, cuts.k_covered), _start(v, cuts.k_covered)
        run, views = _views(layout, self.bhsd, dout, q, k, v, out, dq, dk, dv)
        dout_r, q_r, k_r, v_r, out_r, dq_r, dk_r, dv_r = views
        seq = run.seq_slice
        for c in cuts.cuts:
            qs, ks = c.q, c.k
            o = seq(out_r, qs) if out_r is not None else None
            d = delta[:, :, qs] if delta is not None else None
            args = (seq(dout_r, qs), seq(q_r, qs), seq(k_r, ks), seq(v_r, ks), o)
            g = self.dense(*args, lse[:, :, qs].contiguous(), d, scale, run, c.causal)
            # the first write of covered rows is a copy; later ones add (exact either way)
            for grad, x, sl, copy in (
                (g[0], dq_r, qs, c.q_first and cuts.q_covered),
                (g[1], dk_r, ks, c.k_first and cuts.k_covered),
                (g[2], dv_r, ks, c.k_first and cuts.k_covered),
            ):
                if copy:
                    seq(x, sl).copy_(grad)
                else:
                    seq(x, sl).add_(grad)
        return dq, dk, dv


@functools.lru_cache(maxsize=64)  # (as `expanded`)
def segments_pair(dense: Kernel) -> Kernel:
    """`dense` called once per segment (the fallback for kernels without cu_seqlens)."""
    bhsd = dense.bhsd_ops
    wrapped = _rewrapped(
        dense,
        functools.partial(SegmentsForward, bhsd=bhsd),
        functools.partial(SegmentsBackward, bhsd=bhsd),
    )
    return dataclasses.replace(wrapped, name=f"{dense.name}+segments", segments=True)


def _rewrapped(kernel: Kernel, forward: Callable, backward: Callable) -> Kernel:
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
