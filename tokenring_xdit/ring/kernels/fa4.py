"""flash-attn 4 (the `flash-attn-4` package: CuTe-DSL kernels, imported as `flash_attn.cute`)
as a kernel, `kernel="fa4"`: its forward with the lse, its backward fed our lse (the whole
row's, as every record's), deterministic mode on request. Hopper (sm90) and Blackwell
(sm100/sm110) only: its backward refuses other GPUs, so the record does too.

Not in `auto`'s order: chosen by name only. Measured on H200 (fa4_vs_cudnn.py): as exact as
cuDNN, its forward slower on 2k-4k blocks (1.13-1.25x), its forward + backward 2-11 % faster on
blocks of 8k-16k tokens (docs/kernels-fa4.md has the table, the decision, versions and install).
Kernels compile on their first call per configuration (seconds each), so the first call of a
shape must run eagerly before a CUDA-graph capture of it (the probe and warm-up do).
Its causal mask is bottom-right aligned; our contract is top-left, which agrees on the square
blocks the ring runs causally (the diagonal block, a document's own tokens), so a rectangular
causal block is refused rather than silently shifted.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys

import torch

from ..tensor_layout import Layout
from .standin import out_standin_bhsd
from .base import Kernel
from .flashattn import _flip as _bshd  # (b, s, h, d) views, as flash-attn takes them

_ARCHS = (9, 10, 11)  # the compute-capability majors of its forward AND backward


def has_fa4() -> bool:
    """Is flash-attn 4 installed (its `flash_attn.cute` package)?"""
    try:
        return importlib.util.find_spec("flash_attn.cute") is not None
    except (ImportError, ValueError):  # a broken `flash_attn` parent
        return False


@functools.cache
def _interface():
    """flash-attn 4's (forward, backward) entry points. nvidia-cutlass-dsl puts its `cutlass`
    package on sys.path from a .pth file, which a `pip install --target DIR` + PYTHONPATH
    setup never runs; do the same here when `cutlass` is not importable otherwise."""
    if importlib.util.find_spec("cutlass") is None:
        try:
            import nvidia_cutlass_dsl
        except ImportError as exc:
            msg = "kernel 'fa4' needs nvidia-cutlass-dsl (pip install flash-attn-4)"
            raise ImportError(msg) from exc
        sys.path.insert(0, os.path.join(nvidia_cutlass_dsl.__path__[0], "dsl_packages"))
    from flash_attn.cute import interface

    return interface._flash_attn_fwd, interface._flash_attn_bwd


def _check(q: torch.Tensor, k: torch.Tensor, layout: Layout, causal: bool) -> None:
    major = torch.cuda.get_device_capability(q.device)[0]
    if major not in _ARCHS:
        raise NotImplementedError(f"kernel 'fa4' runs on sm90/sm100/sm110, not sm{major}x")
    if causal and q.shape[layout.seq_dim] != k.shape[layout.seq_dim]:
        raise NotImplementedError("kernel 'fa4': a causal block must be square (module docstring)")


def _call(fn, *args, **kwargs):
    """flash-attn 4 validates its inputs with `assert`: report those as refused input."""
    try:
        return fn(*args, **kwargs)
    except AssertionError as exc:
        raise ValueError(f"kernel 'fa4' refused the input: {exc}") from exc


def _forward(q, k, v, scale, layout: Layout, causal):
    _check(q, k, layout, causal)
    fwd, _ = _interface()
    qs, ks, vs = _bshd(layout, q, k, v)
    out, lse = _call(fwd, qs, ks, vs, softmax_scale=scale, causal=causal, return_lse=True)[:2]
    return _bshd(layout, out)[0], lse


def _backward(dout, q, k, v, out, lse, delta, scale, layout: Layout, causal, deterministic=False):
    _check(q, k, layout, causal)
    _, bwd = _interface()
    if out is None:
        out = layout.from_bhsd(out_standin_bhsd(layout.to_bhsd(dout), delta))
    dos, qs, ks, vs, os_ = _bshd(layout, dout, q, k, v, out)
    dq, dk, dv = _call(
        bwd, qs, ks, vs, os_, dos, lse.contiguous(), scale, causal, deterministic=deterministic
    )[:3]
    return _bshd(layout, dq, dk, dv)


FA4 = Kernel(
    "fa4", _forward, _backward, False, half_only=True,
    deterministic_backward=functools.partial(_backward, deterministic=True),
    bhsd_ops=False,  # (b, s, h, d) views, as flash-attn
    package="flash-attn-4", installed=has_fa4,
)  # fmt: skip
