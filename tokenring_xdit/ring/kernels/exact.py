"""Exact attention in fp32 (fp64 stays fp64), any device, also under packed documents' mask:
the `math` kernel (the probes' reference) and `masked` (the same kernel under its packed name,
which also takes a sliding window's banded segments: the window's fallback on any device)."""

from __future__ import annotations

import torch

from ..tensor_layout import Layout
from .base import Kernel, from_bhsd, row_delta


def segments_mask(mask, s_q: int, s_k: int, device) -> torch.Tensor:
    """(s_q, s_k) bool: True where a query may see a key. `mask`: a bool (top-left causal or
    all) or segments (query run x key run of packed documents, causal or full, or a window's
    rectangle with its band)."""
    if isinstance(mask, bool):
        full = torch.ones(s_q, s_k, dtype=torch.bool, device=device)
        return full.tril() if mask else full
    m = torch.zeros(s_q, s_k, dtype=torch.bool, device=device)
    for s in mask:
        block = m[s.q0 : s.q1, s.k0 : s.k1]
        block.fill_(True)
        if s.causal:
            block.tril_()
        if s.band is not None:
            block &= _band(s.q1 - s.q0, s.k1 - s.k0, *s.band, device)
    return m


def _band(n_q: int, n_k: int, lo, hi, device) -> torch.Tensor:
    """(n_q, n_k) bool: lo <= row - column <= hi (None: unbounded)."""
    d = torch.arange(n_q, device=device)[:, None] - torch.arange(n_k, device=device)[None, :]
    keep = torch.ones_like(d, dtype=torch.bool)
    if lo is not None:
        keep &= d >= lo
    if hi is not None:
        keep &= d <= hi
    return keep


def _scores(q, k, scale, layout, mask):
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    qb, kb = (layout.to_bhsd(x).to(acc) for x in (q, k))
    scores = (qb @ kb.transpose(-1, -2)) * scale
    if mask is not False:
        allowed = segments_mask(mask, scores.shape[-2], scores.shape[-1], q.device)
        scores = scores.masked_fill(~allowed, float("-inf"))
    return qb, kb, scores


def _finite(lse: torch.Tensor) -> torch.Tensor:
    """lse with -inf rows (no visible key: a packed block's rows outside every document) as 0,
    so exp(scores - lse) is 0 there, not NaN."""
    return torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)


def math_forward(q, k, v, scale, layout: Layout, mask):
    _, _, scores = _scores(q, k, scale, layout, mask)
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.exp(scores - _finite(lse).unsqueeze(-1)) @ layout.to_bhsd(v).to(scores.dtype)
    return layout.from_bhsd(out.to(q.dtype)), lse.float()


def math_backward(dout, q, k, v, out, lse, delta, scale, layout: Layout, mask):
    if delta is None:
        delta = row_delta(dout, out, layout)
    qb, kb, scores = _scores(q, k, scale, layout, mask)
    acc = scores.dtype
    p = torch.exp(scores - _finite(lse.to(acc)).unsqueeze(-1))
    dob, vb = layout.to_bhsd(dout).to(acc), layout.to_bhsd(v).to(acc)
    dv = p.transpose(-1, -2) @ dob
    ds = p * (dob @ vb.transpose(-1, -2) - delta.to(acc).unsqueeze(-1))
    dq, dk = (ds @ kb) * scale, (ds.transpose(-1, -2) @ qb) * scale
    return from_bhsd(layout, (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)))


MATH = Kernel("math", math_forward, math_backward, True, packed_as="masked")
MASKED = Kernel("masked", math_forward, math_backward, True, segments=True, bands=True)
