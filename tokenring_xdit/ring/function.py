"""TokenRing with autograd, causal (zigzag) or not: the Function and the flash-attn style API.

`token_ring_attn_func(q, k, v, ...)` takes flash-attn's keyword names (as yunchang's ring
functions do): q, k, v (b, s_local, h, d) by default. For causal=True every rank must hold the
zigzag shard of the sequence: chunks r and 2N-1-r of 2N equal chunks, concatenated (yunchang's
`EXTRACT_FUNC_DICT["token_ring"]` = `zigzag_extract_local` does this). Non-causal attention is
exact for any sharding.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .backward import block_backward
from .backward_kernels import select_pair
from .block_forward import BlockCall, block_forward
from .comm import RingPosition
from .layout import Layout
from .schedules import CAUSAL_ZIGZAG, NON_CAUSAL_BLOCKS

__all__ = [
    "token_ring_attn_func",
    "token_ring_attn_qkvpacked_func",
    "TokenRingAttention",
    "reject_unsupported",
    "train_attn",
]


class TokenRingAttention(torch.autograd.Function):
    """out, lse = TokenRing(q, k, v); saves only this rank's q, k, v, out and lse."""

    @staticmethod
    def forward(ctx, q, k, v, call: BlockCall, pos: RingPosition, q_lens: tuple[int, ...]):
        out, lse = block_forward(call, pos, q_lens, q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.call, ctx.pos, ctx.q_lens = call, pos, q_lens
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = block_backward(ctx.call, ctx.pos, ctx.q_lens, dout, q, k, v, out, lse)
        return dq, dk, dv, None, None, None


def train_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pos: RingPosition,
    q_lens: tuple[int, ...],
    layout: Layout,
    scale: float,
    causal: bool,
    kernel,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The block-schedule path, after the input handshake (`api.token_ring_attn` calls it)."""
    pair = select_pair(kernel, q.device, q.dtype, q.shape[3], v.shape[3], deterministic)
    schedule = CAUSAL_ZIGZAG if causal else NON_CAUSAL_BLOCKS
    call = BlockCall(schedule=schedule, pair=pair, layout=layout, scale=scale)
    return TokenRingAttention.apply(q, k, v, call, pos, q_lens)


def reject_unsupported(dropout_p, window_size, softcap, alibi_slopes) -> None:
    """Raise for flash-attn options TokenRing does not implement (same on every rank)."""
    unsupported = []
    if dropout_p:
        unsupported.append(f"dropout_p={dropout_p} (use 0.0)")
    if window_size is not None and tuple(window_size) != (-1, -1):
        unsupported.append(f"window_size={tuple(window_size)} (use (-1, -1))")
    if softcap:
        unsupported.append(f"softcap={softcap} (use 0.0)")
    if alibi_slopes is not None:
        unsupported.append("alibi_slopes (use None)")
    if unsupported:
        raise NotImplementedError(
            f"TokenRing supports plain softmax attention only; got {', '.join(unsupported)}"
        )


def token_ring_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    group: dist.ProcessGroup | None = None,
    *,
    layout: str = "bshd",
    kernel: str = "auto",
):
    """Differentiable TokenRing: out (layout of q), or (out, lse (b, h, s) fp32, None) when
    return_attn_probs. `kernel`: "auto" or a name from `backward_kernels.PAIRS`."""
    from .api import token_ring_attn  # the handshake and the routing live there

    reject_unsupported(dropout_p, window_size, softcap, alibi_slopes)
    out, lse = token_ring_attn(
        q,
        k,
        v,
        group=group,
        layout=layout,
        softmax_scale=softmax_scale,
        causal=causal,
        kernel=kernel,
        deterministic=deterministic,
    )
    return (out, lse, None) if return_attn_probs else out


def token_ring_attn_qkvpacked_func(qkv: torch.Tensor, *args, **kwargs):
    """Packed variant: qkv (b, s, 3, h, d); the other arguments as token_ring_attn_func."""
    return token_ring_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], *args, **kwargs)
