"""The probe: run a kernel once on a tiny input and compare it with the exact kernel, so a
kernel that lacks this device, dtype or head size (or runs and returns garbage) is skipped by
`auto` instead of failing in the first step. Cached per kernel, check, device, dtype and head
sizes; it runs where the kernel is chosen, before any ring step (never inside a CUDA-graph
capture).

Checks: "forward" (a block kernel, no causality), "pair" (a record's causal forward and
stand-in backward), "segments" (a record on a block of two packed documents), "bands" (on a
sliding window's banded segments, overlapping in rows and keys), "gqa-forward" /
"gqa-pair" / "gqa-bands" (does the kernel take 4 query heads against 2 K/V heads itself, on a
causal block / on banded segments, and give what the expanded call gives, dK/dV in 2 heads?). `runs_once` is the one check of a host's own kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable

import torch

from ...caches import Seen
from ..segments import Segment
from ..tensor_layout import BHSD, Layout
from .base import HALF, BlockKernel, Kernel, row_delta
from .exact import MASKED, MATH
from .wrappers import ExpandedBackward, expand_kv, expanded

# what a kernel that cannot serve this input raises (anything else is a bug and propagates)
_UNSERVED = (
    RuntimeError, NotImplementedError, ImportError, TypeError, ValueError, IndexError,
    AttributeError,
)  # fmt: skip
_TWO_DOCS = (Segment(0, 17, 0, 17, True), Segment(17, 40, 17, 40, True))
_BANDS = (Segment(0, 40, 0, 40, False, (0, 7)), Segment(0, 8, 30, 40, False, (-9, 0)))
_EXPANDED_MASKED = expanded(MASKED)


@functools.cache
def works(kernel, check: str, device: torch.device, dtype, d_qk: int, d_v: int) -> bool:
    """Does `kernel` (a block kernel for the "forward" checks, else a `Kernel`) pass `check`?"""
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(heads: int, seq: int, d: int) -> torch.Tensor:
        return torch.randn(1, heads, seq, d, generator=gen).to(device, dtype)

    try:
        got, want = _RUNS[check](kernel, rand, d_qk, d_v, d_qk**-0.5)
    except _UNSERVED:
        return False
    tol = 3e-2 if dtype in HALF else 1e-4
    return all(
        a.shape == b.shape
        and bool((a.float() - b.float()).abs().max() <= tol * max(1.0, b.float().abs().max()))
        for a, b in zip(got, want, strict=True)
    )


def _forward(fn: BlockKernel, rand, d_qk, d_v, scale):
    q, k, v = rand(1, 16, d_qk), rand(1, 16, d_qk), rand(1, 16, d_v)
    return fn(q, k, v, scale, BHSD), MATH.block(q, k, v, scale, BHSD)


def _fwd_bwd(kernel: Kernel, q, k, v, dout, scale, mask) -> list[torch.Tensor]:
    out, lse = kernel.run_forward(q, k, v, scale, BHSD, mask)
    delta = row_delta(dout, out, BHSD)
    grads = kernel.run_backward(dout, q, k, v, None, lse, delta, scale, BHSD, mask)
    return [out, lse, *grads]


def _pair(kernel: Kernel, rand, d_qk, d_v, scale):
    q, k, v, do = rand(2, 24, d_qk), rand(2, 24, d_qk), rand(2, 24, d_v), rand(2, 24, d_v)
    return _fwd_bwd(kernel, q, k, v, do, scale, True), _fwd_bwd(MATH, q, k, v, do, scale, True)


def _segments(kernel: Kernel, rand, d_qk, d_v, scale):
    q, k, v, do = rand(2, 40, d_qk), rand(2, 40, d_qk), rand(2, 40, d_v), rand(2, 40, d_v)
    got = _fwd_bwd(kernel, q, k, v, do, scale, _TWO_DOCS)
    return got, _fwd_bwd(MASKED, q, k, v, do, scale, _TWO_DOCS)


def _bands(kernel: Kernel, rand, d_qk, d_v, scale):
    q, k, v, do = rand(2, 40, d_qk), rand(2, 40, d_qk), rand(2, 40, d_v), rand(2, 40, d_v)
    got = _fwd_bwd(kernel, q, k, v, do, scale, _BANDS)
    return got, _fwd_bwd(MASKED, q, k, v, do, scale, _BANDS)


def _gqa_inputs(rand, d_qk, d_v):
    q, k, v, do = rand(4, 16, d_qk), rand(2, 16, d_qk), rand(2, 16, d_v), rand(4, 16, d_v)
    return q, k, v, do, expand_kv(k, 2, BHSD), expand_kv(v, 2, BHSD)


def _gqa_forward(fn: BlockKernel, rand, d_qk, d_v, scale):
    q, k, v, _, ke, ve = _gqa_inputs(rand, d_qk, d_v)
    return fn(q, k, v, scale, BHSD), fn(q, ke, ve, scale, BHSD)


def _gqa_pair(kernel: Kernel, rand, d_qk, d_v, scale):
    q, k, v, do, ke, ve = _gqa_inputs(rand, d_qk, d_v)
    out, lse = kernel.forward(q, ke, ve, scale, BHSD, True)
    delta = (do.float() * out.float()).sum(-1)
    args = (do, q, k, v, out, lse, delta, scale, BHSD, True)
    got = (*kernel.forward(q, k, v, scale, BHSD, True), *kernel.backward(*args))
    return got, (out, lse, *ExpandedBackward(kernel.backward)(*args))


def _gqa_bands(kernel: Kernel, rand, d_qk, d_v, scale):
    q, k, v, do = rand(4, 40, d_qk), rand(2, 40, d_qk), rand(2, 40, d_v), rand(4, 40, d_v)
    got = _fwd_bwd(kernel, q, k, v, do, scale, _BANDS)
    return got, _fwd_bwd(_EXPANDED_MASKED, q, k, v, do, scale, _BANDS)


_RUNS = {
    "forward": _forward,
    "pair": _pair,
    "segments": _segments,
    "bands": _bands,
    "gqa-forward": _gqa_forward,
    "gqa-pair": _gqa_pair,
    "gqa-bands": _gqa_bands,
}

_RAN = Seen(256)  # keys of the host kernels that ran once (one per host kernel and device)


def runs_once(kernel: BlockKernel, key: Hashable, q, k, v, scale, layout: Layout) -> None:
    """Run a host's own kernel once on the first token of this call's inputs (its errors
    propagate, for the host to explain), remembered under `key`: a kernel that fails inside the
    ring would leave transfers in flight on every rank."""
    if key in _RAN or q.shape[layout.seq_dim] == 0 or k.shape[layout.seq_dim] == 0:
        return
    first = slice(0, 1)
    with torch.no_grad():
        kernel(*(layout.seq_slice(x, first).contiguous() for x in (q, k, v)), scale, layout)
    _RAN.put(key)
