"""TokenRing behind yunchang's ring-function contract (that of `ring_flash_attn_func`).

Tensors are (b, s_local, h_local, d); yunchang's `attn_type` picks the per-block kernel, mapped to
one that returns a real lse (yunchang's own TORCH_MATH/TORCH_CUDNN kernels return zeros there, and
its torch kernels round lse to the input dtype). Its contract is zigzag shards (which
EXTRACT_FUNC_DICT["token_ring"] cuts): a causal call passes that split (`Split(proof="host")`).
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.distributed as dist
from yunchang.kernels import AttnType, select_flash_attn_impl

from ..ring.api import reject_unsupported, token_ring_attn_func
from ..ring.kernels import BlockKernel, KeyedKernel, has_flash_attn, lse_bhs
from ..ring.kernels.names import KernelName
from ..ring.split.value import HOST, ZIGZAG, Split
from ..ring.tensor_layout import BHSD, Layout

__all__ = [
    "token_ring_flash_attn_func",
    "token_ring_flash_attn_qkvpacked_func",
    "kernel_for",
    "reject_unsupported",
]

log = logging.getLogger("tokenring_xdit")

_OWN_KERNELS = {
    AttnType.TORCH_FLASH: KernelName.TORCH_FLASH.value,
    AttnType.TORCH_EFFICIENT: KernelName.TORCH_EFFICIENT.value,
    AttnType.TORCH_CUDNN: KernelName.CUDNN.value,
}
_UNUSABLE = {
    AttnType.SPARSE_SAGE: "returns no lse",
    AttnType.NPU: "uses a different calling convention",
}


def _from_yunchang(fn) -> BlockKernel:
    """Adapt a yunchang fwd-only kernel (b, s, h, d) -> (out, lse) to our block-kernel contract."""

    def kernel(q, k, v, scale, layout: Layout):
        flip = layout is BHSD
        qs, ks, vs = (x.transpose(1, 2) if flip else x for x in (q, k, v))
        out, lse = fn(
            qs,
            ks,
            vs,
            dropout_p=0.0,
            softmax_scale=scale,
            causal=False,
            window_size=(-1, -1),
            softcap=0.0,
            alibi_slopes=None,
            return_softmax=False,
        )
        b, s, h, _ = qs.shape
        return (out.transpose(1, 2) if flip else out), lse_bhs(lse, b, h, s)

    return kernel


@functools.lru_cache(maxsize=64)
def _kernel_for(attn_type, attn_processor, device_type: str) -> str | BlockKernel:
    if attn_type is None:  # callers that name no kernel (xDiT's long-context layer may not)
        return "auto"
    if attn_type in _UNUSABLE:
        raise NotImplementedError(
            f"TokenRing cannot use yunchang attn_type {attn_type}: it {_UNUSABLE[attn_type]}"
        )
    if attn_type is AttnType.FA and not has_flash_attn():
        log.info(
            "tokenring_xdit: flash-attn is not installed; AttnType.FA runs the best "
            "available kernel with lse instead (cuDNN / torch SDPA / CPU flash)"
        )
        return "auto"
    if attn_type is AttnType.FA:
        return KernelName.FLASH_ATTN.value
    if attn_type is AttnType.TORCH_MATH:  # yunchang's returns lse = 0; use an exact one
        return KernelName.CPU_FLASH.value if device_type == "cpu" else KernelName.MATH.value
    if device_type == "cpu":
        if attn_type in _OWN_KERNELS:  # torch's SDPA kernels have one CPU equivalent
            return KernelName.CPU_FLASH.value
        raise NotImplementedError(_no_kernel(attn_type, device_type, "it has no CPU kernel"))
    if attn_type in _OWN_KERNELS:
        return _OWN_KERNELS[attn_type]
    try:
        return _from_yunchang(select_flash_attn_impl(attn_type, "fwd-only", attn_processor))
    except (ImportError, RuntimeError, ValueError) as exc:  # its package or GPU is missing
        raise NotImplementedError(_no_kernel(attn_type, device_type, f"{exc}")) from exc


# attn types served on each device without optional packages (flash-attn, sageattention, ...)
_WORKING = {
    "cpu": (AttnType.FA, AttnType.TORCH_MATH, *_OWN_KERNELS),
    "cuda": (AttnType.FA, AttnType.TORCH_MATH, *_OWN_KERNELS),
}


def _no_kernel(attn_type, device_type: str, why: str) -> str:
    working = ", ".join(f"AttnType.{t.name}" for t in _WORKING.get(device_type, ()))
    return (
        f"TokenRing cannot run yunchang attn_type {attn_type} on {device_type} ({why}); "
        f"attn types that work there: {working}"
    )


def kernel_for(attn_type, attn_processor, device: torch.device) -> str | BlockKernel:
    """The block kernel that serves yunchang's `attn_type` on `device`: a kernel name, or a
    KeyedKernel (named by the attn type, so ring calls with it can be graphed)."""
    found = _kernel_for(attn_type, attn_processor, device.type)
    return found if isinstance(found, str) else KeyedKernel(found, (attn_type, attn_processor))


def token_ring_flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *args,
    attn_type: AttnType = AttnType.FA,
    attn_processor: torch.nn.Module | None = None,
    **kwargs,
):
    """yunchang ring function: out (b, s, h, d), or (out, lse (b, h, s) fp32, None); the
    arguments of `token_ring_attn_func` (flash-attn's names and order: dropout_p, softmax_scale,
    causal, ..., group) plus yunchang's attn_type / attn_processor, which pick the block kernel.

    Differentiable; causal=True needs zigzag shards (EXTRACT_FUNC_DICT['token_ring'] gives
    them). Training and causal calls need a yunchang attn_type whose kernel has a backward
    (FA, TORCH_FLASH, TORCH_EFFICIENT, TORCH_CUDNN, TORCH_MATH).
    """
    kernel = kernel_for(attn_type, attn_processor, q.device)
    if (args[2] if len(args) > 2 else kwargs.get("causal")) and "split" not in kwargs:
        group = args[8] if len(args) > 8 else kwargs.get("group")
        n = dist.get_world_size(group) if dist.is_initialized() else 1
        if n > 1 and q.shape[1] % 2 == 0:  # the contract's zigzag split (else the call says why)
            kwargs["split"] = Split(kind=ZIGZAG, total=q.shape[1] * n, world_size=n, proof=HOST)
    return token_ring_attn_func(q, k, v, *args, kernel=kernel, host="yunchang", **kwargs)


def token_ring_flash_attn_qkvpacked_func(qkv: torch.Tensor, *args, **kwargs):
    """Packed variant: qkv (b, s, 3, h, d); the other arguments as token_ring_flash_attn_func."""
    return token_ring_flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], *args, **kwargs)
