"""flash-attn (the optional extra) as a kernel: `flash_attn_func` forward, `_flash_attn_backward`
backward (its deterministic mode where deterministic=True)."""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os

import torch

from ..tensor_layout import BHSD, Layout
from .standin import out_standin_bhsd
from .base import Kernel


def has_flash_attn() -> bool:
    """Is flash-attn (2.x, `flash_attn_func`) installed? flash-attn 4 alone installs a bare
    namespace `flash_attn` holding only its `cute` package, which does not count."""
    spec = importlib.util.find_spec("flash_attn")
    places = (spec.submodule_search_locations or ()) if spec is not None else ()
    return any(os.path.exists(os.path.join(p, "flash_attn_interface.py")) for p in places)


def _flip(layout: Layout, *xs):
    # flash-attn wants (b, s, h, d); transpose(1, 2) maps between the two layouts both ways
    return tuple(x.transpose(1, 2) if layout is BHSD and x is not None else x for x in xs)


def _forward(q, k, v, scale, layout: Layout, causal):
    from flash_attn import flash_attn_func  # optional extra

    qs, ks, vs = _flip(layout, q, k, v)
    out, lse, _ = flash_attn_func(
        qs, ks, vs, softmax_scale=scale, causal=causal, return_attn_probs=True
    )
    return _flip(layout, out)[0], lse.float()


@functools.cache
def _backward_params() -> frozenset[str]:
    from flash_attn.flash_attn_interface import _flash_attn_backward

    return frozenset(inspect.signature(_flash_attn_backward).parameters)


def _backward_impl(dout, q, k, v, out, lse, delta, scale, layout, causal, deterministic):
    from flash_attn.flash_attn_interface import _flash_attn_backward

    if out is None:
        out = layout.from_bhsd(out_standin_bhsd(layout.to_bhsd(dout), delta))
    dos, qs, ks, vs, os_ = (x.contiguous() for x in _flip(layout, dout, q, k, v, out))
    dq, dk, dv = (torch.empty_like(x) for x in (qs, ks, vs))
    kwargs = dict(dropout_p=0.0, softmax_scale=scale, causal=causal, softcap=0.0)
    kwargs.update(alibi_slopes=None, deterministic=deterministic)
    params = _backward_params()
    if "window_size" in params:  # flash-attn 2.6
        kwargs["window_size"] = (-1, -1)
    else:
        kwargs.update(window_size_left=-1, window_size_right=-1)
    kwargs = {key: val for key, val in kwargs.items() if key in params}
    _flash_attn_backward(dos, qs, ks, vs, os_, lse.contiguous(), dq, dk, dv, **kwargs)
    return _flip(layout, dq, dk, dv)


def _backward(*args):
    return _backward_impl(*args, deterministic=False)


def _backward_deterministic(*args):
    return _backward_impl(*args, deterministic=True)


FLASH_ATTN = Kernel(
    "flash_attn", _forward, _backward, False, half_only=True,
    deterministic_backward=_backward_deterministic, bhsd_ops=False,  # (b, s, h, d) views
    package="flash-attn", installed=has_flash_attn,
)  # fmt: skip
