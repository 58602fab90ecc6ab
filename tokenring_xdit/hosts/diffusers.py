"""TokenRing behind diffusers' native context parallelism (diffusers >= 0.36).

diffusers' contract: every attention backend that supports context parallelism hands its call to
`attention_dispatch._templated_context_parallel_attention(query, key, value, attn_mask,
dropout_p, is_causal, scale, enable_gqa, return_lse, *, forward_op, backward_op,
_parallel_config)` with this rank's shards in (b, s, h, d). `forward_op(ctx, q, k, v, attn_mask,
dropout_p, is_causal, scale, enable_gqa, return_lse, _save_ctx=, _parallel_config=)` is the
backend's own kernel; with return_lse=True it returns (out (b, s, h, d), lse (b, s, h)), some
backends/torch versions lse (b, s, h, 1).

`context_parallel_attention` runs the ring dimension of that call as TokenRing (the ring-only
path, ring_anything's uneven lengths, and the ring inside ulysses x ring), on the ring mesh's
process group, with the backend's forward op as TokenRing's per-block kernel. Ulysses'
all-to-alls stay diffusers' own (`SeqAllToAllDim`). Whether to call it at all is decided by
`patches/diffusers.py`.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Hashable

import torch

from ..ring.api import attend
from ..ring.kernels import BlockKernel, runs_once
from ..ring.kernels.names import KernelName
from ..ring.seam.prepare import CallOptions
from ..ring.tensor_layout import BSHD
from .selection import Refusal, raise_refused

__all__ = ["context_parallel_attention", "block_kernel", "HOST"]

HOST = "diffusers"

# Forward ops of diffusers' CP-capable backends that cannot return an lse -> backend name.
_NO_LSE_OPS = {"_native_attention_forward_op": "native", "_npu_attention_forward_op": "_native_npu"}
_USE_DIFFUSERS_RING = "or keep diffusers' own ring: TOKENRING_XDIT_RING_IMPL=default"


def context_parallel_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    scale: float | None,
    return_lse: bool,
    forward_op: Callable,
    parallel_config,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """diffusers' templated CP attention with TokenRing as the ring.

    query/key/value: this rank's (b, s, h, d) shards (lengths may differ across ring ranks).
    Returns out (b, s, h, d) in query's dtype, plus lse (b, s, h) fp32 when `return_lse`.
    """
    raise_refused(cp_refusals(query, key, value, attn_mask, dropout_p))
    if torch.compiler.is_compiling():  # the kernel travels by name (_compiled_kernel)
        if _op_name(forward_op) in _NO_LSE_OPS:
            raise _no_lse_error(forward_op)
        kernel = _compiled_kernel(forward_op, query.device.type)
    else:
        _require_lse(forward_op, parallel_config, query, key, value, scale)
        kernel = block_kernel(forward_op, parallel_config)
    cp = parallel_config.context_parallel_config
    if cp.ulysses_degree > 1:
        return _unified(query, key, value, scale, return_lse, kernel, forward_op, cp)
    out, lse = _ring(query, key, value, scale, kernel, forward_op, cp)
    return (out, lse.transpose(1, 2)) if return_lse else out


def block_kernel(forward_op: Callable, parallel_config) -> BlockKernel:
    """diffusers' forward op as a TokenRing block kernel: (q, k, v, scale, layout) in (b, s, h, d)
    -> (out (b, s, h, d), lse (b, h, s) fp32)."""

    def kernel(q, k, v, scale, layout):
        if layout is not BSHD:
            raise ValueError("diffusers' forward ops take (b, s, h, d) tensors")
        return _call_forward_op(forward_op, parallel_config, q, k, v, scale)

    return kernel


def _call_forward_op(forward_op, parallel_config, q, k, v, scale):
    # _save_ctx=False: the op keeps nothing for a backward, so a throwaway ctx will do.
    result = forward_op(
        types.SimpleNamespace(),
        q,
        k,
        v,
        None,
        0.0,
        False,
        scale,
        False,
        True,
        _save_ctx=False,
        _parallel_config=parallel_config,
    )
    if not isinstance(result, tuple) or len(result) != 2 or result[1] is None:
        raise _no_lse_error(forward_op)
    out, lse = result
    b, s, h, _ = q.shape
    if lse.dim() == 4 and lse.shape[-1] == 1:
        lse = lse.squeeze(-1)
    if tuple(lse.shape) != (b, s, h):
        raise RuntimeError(
            f"diffusers' {_backend_name(forward_op)!r} forward op returned lse of shape "
            f"{tuple(lse.shape)}; expected (b, s, h) = {(b, s, h)}, its model layout"
        )
    return out, lse.transpose(1, 2).float()


def _ring(query, key, value, scale, kernel, forward_op, cp) -> tuple[torch.Tensor, torch.Tensor]:
    """TokenRing over the ring mesh: out (b, s, h, d), lse (b, h, s) fp32 (eager, or one
    `tokenring::attn` node while Dynamo traces: the kernel is then a name, _compiled_kernel)."""
    if _needs_grad(query, key, value):
        # Training: TokenRing's own forward/backward kernel pair for the device (the backend's
        # forward op has no per-block backward TokenRing could pair with it).
        kernel = "auto"
    traced = torch.compiler.is_compiling()
    options = CallOptions(
        group=cp._ring_mesh.get_group(), layout="bshd", softmax_scale=scale, kernel=kernel,
        kernel_key=None if traced else _kernel_key(forward_op),
    )  # fmt: skip
    # uneven shards whose lengths can change out of step between calls: check every call
    validate = "always" if getattr(cp, "ring_anything", False) else ""
    return attend(query, key, value, options, host=HOST, validate=validate)


# diffusers forward op -> the TokenRing kernel of its family, for compiled calls on CUDA
_COMPILED_KERNELS = {
    "_cudnn_attention_forward_op": KernelName.CUDNN.value,
    "_native_flash_attention_forward_op": KernelName.TORCH_FLASH.value,
    "_flash_attention_forward_op": KernelName.FLASH_ATTN.value,
}


def _compiled_kernel(forward_op, device_type: str) -> str:
    """Under torch.compile the ring's block kernel is a name (ring/seam/compiled_op.py: a callable
    cannot be a graph constant): the TokenRing kernel of the backend's family, else (and on CPU)
    "auto", the fastest TokenRing kernel with an lse for the device. Same attention, exact."""
    if device_type != "cuda":
        return "auto"
    return _COMPILED_KERNELS.get(_op_name(forward_op), "auto")


def _needs_grad(*xs: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(x.requires_grad for x in xs)


def _unified(query, key, value, scale, return_lse, kernel, forward_op, cp):
    """Ulysses x ring: diffusers' own all-to-alls around TokenRing (heads scattered over the
    ulysses group, sequence gathered), as `_templated_unified_attention` does around its ring."""
    import diffusers.models.attention_dispatch as attention_dispatch

    a2a = getattr(attention_dispatch, "SeqAllToAllDim", None)
    if a2a is None:  # diffusers 0.36 has no ulysses x ring at all (its config refuses it)
        raise NotImplementedError("ulysses x ring context parallelism needs diffusers >= 0.37")
    group = cp._ulysses_mesh.get_group()
    q, k, v = (a2a.apply(group, x, 2, 1) for x in (query, key, value))
    out, lse = _ring(q, k, v, scale, kernel, forward_op, cp)
    out = a2a.apply(group, out, 1, 2)
    if not return_lse:
        return out
    # (b, h/u, s*u) -> (b, s*u, h/u, 1): the all-to-all takes 4-d tensors
    lse = a2a.apply(group, lse.transpose(1, 2).unsqueeze(-1).contiguous(), 1, 2)
    return out, lse.squeeze(-1)


def cp_refusals(
    query, key, value, attn_mask, dropout_p, is_causal: bool = False, enable_gqa: bool = False
) -> list[Refusal]:
    """What TokenRing does not run under diffusers (the patch's `auto` keeps diffusers' ring for
    these); the adapter raises for masks and dropout, local checks before any collective that
    every rank of a CP model answers alike. (Causal, GQA: diffusers' own ring refuses them;
    training: the backward raises.)"""
    grad = torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value))
    return [
        ("causal calls", bool(is_causal), ""),
        ("GQA", bool(enable_gqa), ""),
        ("attention masks", attn_mask is not None,
         "TokenRing does not take an attention mask yet (diffusers passed one to the "
         f"context-parallel attention); call the model without one, {_USE_DIFFUSERS_RING}"),
        ("dropout", bool(dropout_p),
         f"TokenRing is for inference: dropout_p must be 0, got {dropout_p}"),
        ("training (gradients)", grad, ""),
    ]  # fmt: skip


def _require_lse(forward_op, parallel_config, query, key, value, scale) -> None:
    """Refuse a backend whose forward op has no lse, before the ring posts anything: a kernel
    failing inside the ring would leave transfers in flight on every rank."""
    if _op_name(forward_op) in _NO_LSE_OPS:
        raise _no_lse_error(forward_op)
    cache_key = (
        _kernel_key(forward_op) or id(forward_op),
        query.device.type,
        query.dtype,
        query.shape[3],
        value.shape[3],
    )
    kernel = block_kernel(forward_op, parallel_config)
    try:
        runs_once(kernel, cache_key, query, key, value, scale, BSHD)
    except (ValueError, NotImplementedError) as exc:
        if "lse" in str(exc).lower():
            raise _no_lse_error(forward_op) from exc
        raise


def _no_lse_error(forward_op) -> NotImplementedError:
    return NotImplementedError(
        "TokenRing needs a per-block attention kernel that returns its log-sum-exp, and "
        f"diffusers' attention backend {_backend_name(forward_op)!r} does not. Pick one that "
        "does before enable_parallelism, e.g. transformer.set_attention_backend('_native_cudnn') "
        f"(CP backends with an lse: {', '.join(_lse_backends())}); on CPU use '_native_flash' "
        "with tokenring_xdit.patches.diffusers_cpu.enable()"
    )


def _lse_backends() -> list[str]:
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    capable = getattr(_AttentionBackendRegistry, "_supports_context_parallel", set())
    return sorted(set(capable) - set(_NO_LSE_OPS.values()))


def _op_name(forward_op) -> str:
    func = forward_op.func if isinstance(forward_op, functools.partial) else forward_op
    return getattr(func, "__name__", repr(func))


def _backend_name(forward_op) -> str:
    name = _op_name(forward_op)
    return _NO_LSE_OPS.get(name, name.removesuffix("_forward_op").lstrip("_"))


def _kernel_key(forward_op) -> Hashable | None:
    """A name for the op that is stable across calls (backends build a new functools.partial
    per call), so TokenRing can keep one CUDA graph per op and shapes; None if unhashable."""
    key: Hashable = forward_op
    if isinstance(forward_op, functools.partial):
        key = (forward_op.func, forward_op.args, tuple(sorted(forward_op.keywords.items())))
    try:
        hash(key)
    except TypeError:
        return None
    return ("diffusers", key)
