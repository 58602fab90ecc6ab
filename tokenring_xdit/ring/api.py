"""`token_ring_attn`: the public TokenRing call over a RingConfig and a schedule."""

from __future__ import annotations

from collections.abc import Hashable

import torch
import torch.distributed as dist

from ..config import RingConfig, current
from .agree import CallSpec, Problem, agree, digest, needs_grad
from .comm import RingPosition
from .compiled import compiled_attn, use_eager
from .documents import Documents
from .forward import RingCall, local_forward, ring_forward
from .function import train_attn
from .graphs import graphs_wanted, run_graphed
from .head_start import ring_pause_us
from .kernels import BlockKernel, SwappedKernel, resolve_kernel
from .layout import Layout, get_layout
from .schedules import NON_CAUSAL

__all__ = [
    "token_ring_attn",
    "token_ring_attn_func",
    "token_ring_attn_qkvpacked_func",
    "reject_unsupported",
]

_JOINT_STRATEGIES = ("front", "rear")


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
    positions: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | list[int] | None = None,
    position_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention of the local queries against the K/V of every rank of `group`.

    Every setting that decides the call is agreed across the ring first (ring/agree/): bad
    input is one error on every rank, before any transfer.

    Arguments:
        q: (batch_size, seqlen_q, nheads, headdim) with layout="bshd", or
            (batch_size, nheads, seqlen_q, headdim) with layout="bhsd"; this rank's queries.
        k: (batch_size, seqlen_k, nheads_k, headdim) in the same layout; this rank's keys.
            seqlen_k may differ from seqlen_q (a KV cache) and from other ranks' lengths;
            nheads must be a multiple of nheads_k (GQA/MQA).
        v: (batch_size, seqlen_k, nheads_k, headdim_v) in the same layout.
        group: the ring's process group; None: the default (world) group.
        layout: "bshd" or "bhsd" (or a `Layout`).
        softmax_scale: float. Default 1 / sqrt(headdim).
        causal: bool. Causal attention over zigzag shards (rank r holds chunks r and 2N-1-r of
            2N): cut them with `tokenring_xdit.shard(x, group, causal=True)` (or yunchang's
            EXTRACT_FUNC_DICT["token_ring"]), or pass `positions`.
        kernel: a name from `kernels.KERNELS`, "auto", or a callable
            (q, k, v, scale, layout) -> (out, lse fp32); a `KeyedKernel` names itself for the
            CUDA-graph cache, a plain callable needs `kernel_key` to be graphed.
        final_chunks: int. Pieces of the last partial's return (overrides config's).
        joint_kv: (key, value), extra K/V (xDiT's joint text tokens) of shape
            (batch_size, seqlen_j, nheads_k, headdim[_v]) that this rank's own queries attend
            exactly once, joined before ("front") or after ("rear", `joint_strategy`) the local
            K/V in the step-0 block. Inference only.
        cuda_graph: bool. Replay a CUDA graph per input signature (overrides config's).
        config: a `RingConfig`; None: the environment's (`tokenring_xdit.config`).
        deterministic: bool. Training path only: a deterministic backward pair.
        positions: (seqlen_q,) or (batch_size, seqlen_q) int, the global token positions of
            this shard: the proof of a causal call's zigzag layout.
        cu_seqlens: (num_docs + 1,) int offsets of packed documents in the WHOLE global
            sequence (0, ..., S; flash-attn's convention), equal on every rank; keep them on
            the CPU (read on the host). Attention stays inside each document.
        position_ids: (seqlen_q,) or (batch_size, seqlen_q) int, this shard's per-document
            positions that restart at 0 where a document starts (transformers' packed
            batches); every rank learns the same documents from them in the input check.

    Returns:
        out: same shape and dtype as q, with headdim_v as its last dim; stored like q where q
            was stored with seq and heads swapped and Q travelled that way (ring/layout.storage),
            as SDPA's output follows q; else contiguous.
        lse: (batch_size, nheads, seqlen_q) float32, the log-sum-exp of each query's scores.

    causal=True and inputs that require grad run the differentiable block-schedule path
    (`function.train_attn`). Packed documents: non-causal shards are the contiguous shards in
    rank order, causal ones zigzag shards; K/V must be the query's tokens; batch size 1 (one
    layout for the batch); blocks whose tiles share no document are skipped
    (ring/documents.py); `kernel` may also be "masked" or "flash_varlen" there. Under
    torch.compile the call is one opaque operator (`compiled.py`; `kernel` by name only; packed
    documents raise there).
    """
    if torch.compiler.is_compiling():  # Dynamo is tracing: the ring becomes one graph node
        if cu_seqlens is not None or position_ids is not None:
            # raised while tracing, so on every rank that compiles the same model
            raise NotImplementedError(
                "TokenRing: packed documents (cu_seqlens / position_ids) under torch.compile are "
                "not supported yet; run the attention eagerly (torch.compiler.disable) for packed "
                "batches"
            )
        return compiled_attn(
            q, k, v, group=group, layout=layout, softmax_scale=softmax_scale, causal=causal,
            kernel=kernel, final_chunks=final_chunks, joint_kv=joint_kv,
            joint_strategy=joint_strategy, cuda_graph=cuda_graph, config=config,
            deterministic=deterministic, positions=positions,
        )  # fmt: skip
    cfg = config if config is not None else current()
    layout = get_layout(layout)
    pos = RingPosition.of(group)
    if joint_strategy not in _JOINT_STRATEGIES:
        raise ValueError(f"joint_strategy must be 'front' or 'rear', got {joint_strategy!r}")
    chunks = final_chunks if final_chunks is not None else cfg.final_chunks
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    docs, doc_problem = _documents(cu_seqlens, position_ids)
    packed = cu_seqlens is not None or position_ids is not None
    train = causal or needs_grad(q, k, v) or packed
    fn, key, family, problem = _resolve_kernel(
        kernel, kernel_key, q, k, v, layout, train, deterministic, packed
    )
    problem = doc_problem if doc_problem[0] and not problem[0] else problem
    graphs = (cfg.cuda_graphs if cuda_graph is None else cuda_graph) and key is not None
    spec = CallSpec(
        q, k, v, layout, causal, chunks, scale, digest(family), graphs and not train,
        cfg.validate, joint_kv, positions, *problem, transport=cfg.transport,
        documents=docs, doc_positions=position_ids if cu_seqlens is None else None,
        timeout=cfg.timeout, family=family,
    )  # fmt: skip
    ring = agree(spec, pos, comm=cfg.comm)  # the same error on every rank, or the agreed ring
    head_start_us = ring_pause_us(cfg.comm_head_start_us, ring.transport)
    if train:
        return train_attn(q, k, v, ring, layout, scale, causal, fn, ring.docs, head_start_us)
    # Q and partials travel in the agreed wire layout: the other one where q is stored with
    # seq and heads swapped (xDiT's (b, h, s, d) views of (b, s, h, d) projections), so neither
    # q nor the output is copied; the output then keeps q's storage order, as SDPA's does.
    wire = layout.other if ring.swapped else layout
    call = RingCall(
        schedule=NON_CAUSAL,
        kernel=fn if wire is layout else SwappedKernel(fn, layout),
        kernel_key=key,
        layout=wire,
        scale=scale,
        chunks=min(chunks, min(ring.q_lens)),  # equal piece count on every rank
        joint_strategy=joint_strategy,
        fused_merge=cfg.fused_merge,
        defer_own=cfg.defer_own,
        head_start_us=head_start_us,
    )
    if pos.size == 1:
        return local_forward(call, q, k, v, joint_kv)
    inputs = (q, k, v) + (tuple(joint_kv) if joint_kv is not None else ())
    if wire is not layout:
        inputs = tuple(x.transpose(1, 2) for x in inputs)

    def run(xs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        return ring_forward(call, ring, ring.q_lens, *xs[:3], xs[3:] or None)

    if not graphs_wanted(graphs, q.device):
        result = run(inputs)
    else:
        signature = tuple((x.shape, x.stride(), x.dtype) for x in inputs)
        graph_key = (pos.group, ring.key, call.graph_key(), signature)  # agreed + local shapes
        result = run_graphed(graph_key, inputs, run, pos.group)
    ring.finished("forward")
    if wire is not layout:
        return result[0].transpose(1, 2), result[1]
    return result


def _documents(cu_seqlens, position_ids) -> tuple[Documents | None, tuple[Problem, str]]:
    """(checked documents from cu_seqlens, (problem, text)) for the input check."""
    if cu_seqlens is None:
        if position_ids is not None and not isinstance(position_ids, torch.Tensor):
            return None, (Problem.POSITION_IDS, "")
        return None, (Problem.NONE, "")
    try:
        return Documents.of(cu_seqlens), (Problem.NONE, "")
    except (ValueError, TypeError) as exc:
        return None, (Problem.CU_SEQLENS, str(exc).splitlines()[0][:300])


def _resolve_kernel(
    kernel, kernel_key, q, k, v, layout, train: bool, deterministic: bool, packed: bool = False
):
    """(kernel or record, graph key, agreed family, (problem, text)): kernels.resolve_kernel."""
    *head, problem, text = resolve_kernel(
        kernel, kernel_key, q, k, v, layout, train=train, deterministic=deterministic, packed=packed
    )
    return (*head, (problem, text))


# --- flash-attn style functional API (ring-flash-attention's keyword names) ---------------


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
    positions: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | list[int] | None = None,
    position_ids: torch.Tensor | None = None,
):
    """Differentiable TokenRing: out (layout of q), or (out, lse (b, h, s) fp32, None) when
    return_attn_probs. `kernel`: "auto" or a name from `backward_kernels.PAIRS`. `group=None`:
    the default (world) group. causal=True over several ranks needs zigzag shards with proof
    (`tokenring_xdit.shard(x, group, causal=True)`, or `positions`: see token_ring_attn).
    Packed documents: `cu_seqlens` (of the whole sequence) or `position_ids` (restarting): see
    token_ring_attn."""
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
        positions=positions,
        cu_seqlens=cu_seqlens,
        position_ids=position_ids,
    )
    return (out, lse, None) if return_attn_probs else out


def token_ring_attn_qkvpacked_func(qkv: torch.Tensor, *args, **kwargs):
    """Packed variant: qkv (b, s, 3, h, d); the other arguments as token_ring_attn_func."""
    return token_ring_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], *args, **kwargs)


use_eager(token_ring_attn, _resolve_kernel)  # the compiled op's real side runs these
