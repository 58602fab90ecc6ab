"""`token_ring_attn`: the public TokenRing call, a thin dispatcher over `call.prepare`.

Eager calls prepare the call (call.py: options checked and agreed across the ring) and run it:
the block-schedule path with autograd or the inference path (seam/run.py). While
Dynamo traces, the call becomes one opaque operator (compiled.py), whose real side prepares and
runs it the same way. The arguments are documented on `call.CallOptions`.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch
import torch.distributed as dist

from ..config import RingConfig
from .kernels import BlockKernel
from .seam.compiled_op import compiled_attn, count_host
from .seam.prepare import CallOptions, prepare
from .seam.run import infer, train_attn
from .split.value import Split
from .tensor_layout import Layout

__all__ = [
    "attend",
    "token_ring_attn",
    "token_ring_attn_func",
    "token_ring_attn_qkvpacked_func",
    "reject_unsupported",
]


def token_ring_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    layout: str | Layout = "bshd",
    softmax_scale: float | None = None,
    causal: bool = False,
    kernel: str | BlockKernel = "auto",
    final_chunks: int | None = None,
    joint_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    joint_strategy: str = "rear",
    cuda_graph: bool | None = None,
    kernel_key: Hashable | None = None,
    config: RingConfig | None = None,
    deterministic: bool = False,
    split: Split | None = None,
    positions: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | list[int] | None = None,
    position_ids: torch.Tensor | None = None,
    travel: str = "auto",
    window_size: tuple[int, int] = (-1, -1),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention of the local queries against the K/V of every rank of `group`.

    q, k, v and every keyword: see `tokenring_xdit.ring.seam.prepare.CallOptions`. Every setting
    that decides the call is agreed across the ring first (ring/agree/): bad input is one error on
    every rank, before any transfer. causal=True, inputs that require grad, and packed documents run
    the differentiable block-schedule path (`seam.run.train_attn`). Under torch.compile the call is
    one opaque operator (`compiled.py`; `kernel` by name only).

    Returns:
        out: same shape and dtype as q, with headdim_v as its last dim; stored like q where q
            was stored with seq and heads swapped and Q travelled that way (ring/layout.storage),
            as SDPA's output follows q; else (and under torch.compile) contiguous.
        lse: (batch_size, nheads, seqlen_q) float32, the log-sum-exp of each query's scores.
    """
    options = CallOptions(
        group=group, layout=layout, softmax_scale=softmax_scale, causal=causal, kernel=kernel,
        final_chunks=final_chunks, joint_kv=joint_kv, joint_strategy=joint_strategy,
        cuda_graph=cuda_graph, kernel_key=kernel_key, config=config, deterministic=deterministic,
        split=split, positions=positions, cu_seqlens=cu_seqlens, position_ids=position_ids,
        travel=travel, window_size=window_size,
    )  # fmt: skip
    return attend(q, k, v, options)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    options: CallOptions,
    *,
    host: str = "",
    validate: str = "",
) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_ring_attn` with its options as one object, for adapters: `host` is what
    `tokenring_xdit.calls_by_host()` counts the call under; `validate` overrides the config's
    check mode. Eager and compiled alike."""
    if torch.compiler.is_compiling():  # Dynamo is tracing: the ring becomes one graph node
        return compiled_attn((q, k, v), options, host, validate)
    prepared = prepare(q, k, v, options, validate=validate)
    if prepared.train:
        out, lse = train_attn(q, k, v, prepared)
    else:
        out, lse = infer(prepared, q, k, v)
    if host:
        count_host(host)
    return out, lse


# --- flash-attn style functional API (ring-flash-attention's keyword names) ---------------


def reject_unsupported(
    dropout_p: float = 0.0,
    window_size: tuple[int, int] | None = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    **_other,
) -> None:
    """Raise for flash-attn options TokenRing does not implement (same on every rank); other
    flash-attn arguments are ignored here. `window_size`: for the inference entries of hosts
    (a sliding window runs on the training path: `token_ring_attn(window_size=)`)."""
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
    kernel: str | BlockKernel = "auto",
    host: str = "",
    **options,
):
    """Differentiable TokenRing: out (layout of q), or (out, lse (b, h, s) fp32, None) when
    return_attn_probs. `kernel`: "auto" or a name from `kernels.PAIRS`. `group=None`:
    the default (world) group. causal=True over several ranks needs zigzag shards with proof
    (`split=` the split `tokenring_xdit.shard` cut them by, or `positions`). `options`: any other
    `token_ring_attn` keyword (split, positions, cu_seqlens, position_ids for packed documents,
    ...: `seam.prepare.CallOptions`); `host`: what an adapter counts the call under (`attend`)."""
    reject_unsupported(dropout_p, None, softcap, alibi_slopes)  # the window is the call's
    options = CallOptions(
        group=group, layout=layout, softmax_scale=softmax_scale, causal=causal, kernel=kernel,
        deterministic=deterministic, window_size=window_size, **options,
    )  # fmt: skip
    out, lse = attend(q, k, v, options, host=host)
    return (out, lse, None) if return_attn_probs else out


def token_ring_attn_qkvpacked_func(qkv: torch.Tensor, *args, **kwargs):
    """Packed variant: qkv (b, s, 3, h, d); the other arguments as token_ring_attn_func."""
    return token_ring_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], *args, **kwargs)
