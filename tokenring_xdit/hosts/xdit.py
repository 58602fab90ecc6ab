"""TokenRing behind xDiT's two ring entry points.

- `usp_ring_attn`: drop-in for `xfuser.model_executor.layers.usp.ring_attn` (the path PixArt,
  Flux, SD3, ... take in xfuser 0.7): (b, h, s, d), group PROCESS_GROUP.RING_PG, the per-block
  kernel is the `attention_function` xDiT selected (cuDNN, FA2/3, SDPA flash/efficient, ...).
- `long_ctx_ring_attn`: the ring function of `xFuserLongContextAttention`: (b, s, h, d), with the
  PipeFusion KV cache (`attn_layer`) and joint tensors.

Joint (text) K/V: xDiT's decorator concatenates them into the block of ring call 0 ("front") or
the last ring call ("rear"), counting calls per rank. TokenRing handles them itself instead (the
decorator never sees them): each rank's own queries meet the joint K/V in their step-0 block, so
every query attends them exactly once, whatever the chunking of the last step.
"""

from __future__ import annotations

import torch

from ..ring.api import attend, reject_unsupported, token_ring_attn_func
from ..ring.kernels import BlockKernel, KeyedKernel, lse_bhs
from ..ring.kernels.names import KernelName
from ..ring.seam.prepare import CallOptions
from .selection import Refusal, raise_refused
from .yunchang import kernel_for

# xDiT attention backend -> the TokenRing kernel of its family, for compiled calls on CUDA
_COMPILED_KERNELS = {
    "_sdpa_flash_attn_call": KernelName.TORCH_FLASH.value,
    "_sdpa_efficient_attn_call": KernelName.TORCH_EFFICIENT.value,
    "_cudnn_attn_call": KernelName.CUDNN.value,
    "_flash_attn_call": KernelName.FLASH_ATTN.value,
}


def _compiled_kernel(backend, device_type: str) -> str:
    """Under torch.compile the block kernel is a name (ring/seam/compiled_op.py): the TokenRing
    kernel of xDiT's backend family, else (and on CPU) "auto" (the fastest one with an lse)."""
    if device_type != "cuda":
        return "auto"
    return _COMPILED_KERNELS.get(getattr(backend, "__name__", ""), "auto")


__all__ = ["usp_ring_attn", "long_ctx_ring_attn"]


def _xdit_kernel(attention_function, attention_kwargs) -> BlockKernel:
    """Wrap xDiT's selected backend (b, h, s, d) -> (out, lse) into a block kernel."""

    def kernel(q, k, v, scale, layout):
        # xDiT's backends use the default scale; TokenRing passes that same default here.
        out, lse = attention_function(
            q,
            k,
            v,
            dropout_p=0.0,
            is_causal=False,
            joint_attn_kwargs=None,
            attention_kwargs=attention_kwargs,
        )
        if lse is None:
            raise NotImplementedError(
                "this xDiT attention backend returns no lse, so it cannot serve a ring; choose "
                "one that does (--attention_backend cudnn / flash / sdpa_flash / sdpa_efficient)"
            )
        b, h, s, _ = q.shape
        return out, lse_bhs(lse, b, h, s)

    return kernel


# xDiT shards the sequence contiguously; TokenRing's causal schedule needs zigzag shards (a
# contiguous shard would be silently wrong), so causal calls stop here on every rank.
_CAUSAL = (
    "causal calls under xDiT",
    "TokenRing through xDiT is non-causal only: xDiT shards the sequence contiguously and causal "
    "TokenRing needs zigzag shards. For causal attention use yunchang's "
    "LongContextAttention(ring_impl_type='token_ring') with EXTRACT_FUNC_DICT['token_ring'] "
    "shards, or xDiT's own ring",
)


def usp_refusals(dropout_p, is_causal, attention_kwargs) -> list[Refusal]:
    """What usp_ring_attn refuses (the xfuser patch's `auto` keeps xDiT's ring for these)."""
    # per-query extra tensors would follow our queries around the ring; not supported yet
    extra = attention_kwargs.get("ulysses_extra_inputs") if attention_kwargs else None
    return [
        ("dropout", bool(dropout_p), "TokenRing is for inference: dropout_p must be 0"),
        (_CAUSAL[0], bool(is_causal), _CAUSAL[1]),
        ("per-query extra inputs", bool(extra), "TokenRing does not carry a backend's "
         f"per-query extra inputs ({extra}); use xDiT's own ring for it"),
    ]  # fmt: skip


def ring_fn_refusals(
    dropout_p, causal, window_size, alibi_slopes, q_descale, k_descale, v_descale
) -> list[Refusal]:
    """What long_ctx_ring_attn refuses (the xfuser patch's `auto` keeps xDiT's ring for these)."""
    flash = ""
    try:  # the flash-attn options TokenRing lacks: one message naming all of them
        reject_unsupported(dropout_p, window_size, 0.0, alibi_slopes)
    except NotImplementedError as exc:
        flash = str(exc)
    descale = any(x is not None for x in (q_descale, k_descale, v_descale))
    return [
        ("dropout", bool(dropout_p), flash),
        ("a sliding window", tuple(window_size) != (-1, -1), flash),
        ("ALiBi", alibi_slopes is not None, flash),
        (_CAUSAL[0], bool(causal), _CAUSAL[1]),
        ("FP8 descale factors", descale, "TokenRing does not take FP8 descale factors"),
    ]


def usp_ring_attn(
    attention_function,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    joint_attn_kwargs: dict | None = None,
    attention_kwargs: dict | None = None,
) -> torch.Tensor:
    """xfuser 0.7 `usp.ring_attn` contract: (b, h, s, d) in, out (b, h, s, d)."""
    from yunchang.globals import PROCESS_GROUP  # the singleton xDiT's USP uses

    raise_refused(usp_refusals(dropout_p, is_causal, attention_kwargs))
    joint_kv, strategy = None, "rear"
    if joint_attn_kwargs is not None:
        strategy = joint_attn_kwargs.get("joint_strategy") or "rear"
        joint_kv = (joint_attn_kwargs["joint_key"], joint_attn_kwargs["joint_value"])
        # leave the counter where xDiT's decorator would after a full ring
        joint_attn_kwargs["step"] = joint_attn_kwargs.get("total_steps", 1)
    # A CUDA graph may bake in the backend, never per-call attention_kwargs tensors.
    backend = getattr(attention_function, "__wrapped__", attention_function)
    if torch.compiler.is_compiling():  # --use_torch_compile: one graph node, kernel by name
        kernel = _compiled_kernel(backend, query.device.type)
    else:
        kernel = _xdit_kernel(attention_function, attention_kwargs)
        kernel = kernel if attention_kwargs else KeyedKernel(kernel, ("xdit", backend))
    options = CallOptions(
        group=PROCESS_GROUP.RING_PG, layout="bhsd", causal=is_causal, kernel=kernel,
        joint_kv=joint_kv, joint_strategy=strategy,
    )  # fmt: skip
    out, _ = attend(query, key, value, options, host="xdit")
    return out


def long_ctx_ring_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_type=None,
    attn_processor=None,
    attn_layer=None,
    joint_tensor_key: torch.Tensor | None = None,
    joint_tensor_value: torch.Tensor | None = None,
    joint_strategy: str = "none",
    q_descale=None,
    k_descale=None,
    v_descale=None,
    **flash_args,
):
    """`xdit_ring_flash_attn_func` contract: (b, s, h, d); KV cache, joint tensors. xDiT passes
    every argument after q, k, v by name; `flash_args` are flash-attn's (dropout_p,
    softmax_scale, causal, window_size, alibi_slopes, deterministic, return_attn_probs, group:
    those of `token_ring_attn_func`)."""
    raise_refused(ring_fn_refusals(
        flash_args.get("dropout_p", 0.0), flash_args.get("causal", False),
        flash_args.get("window_size", (-1, -1)), flash_args.get("alibi_slopes"),
        q_descale, k_descale, v_descale,
    ))  # fmt: skip
    if attn_layer is not None:  # PipeFusion: K/V grow to the cached sequence, Q stays small
        from xfuser.core.cache_manager.cache_manager import get_cache_manager

        k, v = get_cache_manager().update_and_get_kv_cache(
            new_kv=[k, v], layer=attn_layer, slice_dim=1, layer_type="attn"
        )
        k, v = k.contiguous(), v.contiguous()
    if (joint_tensor_key is None) != (joint_tensor_value is None):
        raise ValueError("joint_tensor_key and joint_tensor_value go together")
    joint_kv = None
    if joint_tensor_key is not None:
        joint_kv = (joint_tensor_key, joint_tensor_value)
    else:
        joint_strategy = "rear"  # xDiT passes "none" without joint tensors; nothing to place
    # the core rejects any joint_strategy other than "front" / "rear" on every rank
    kernel = kernel_for(attn_type, attn_processor, q.device)
    return token_ring_attn_func(
        q, k, v, kernel=kernel, host="xdit", joint_kv=joint_kv, joint_strategy=joint_strategy,
        **flash_args,
    )  # fmt: skip
