"""One TokenRing call, prepared the same way for every entry.

`CallOptions` holds what a caller may ask of one call (the keyword arguments of
`token_ring_attn`, documented on the class); `prepare(q, k, v, options)` turns them into a
`PreparedCall`: the kernel resolved (`kernels.resolve_kernel`), the input check agreed across
the ring (`agree`), the ring, the loop's call object (schedule, kernel, layout, scale,
document plan, head start) and the settings the runner needs. The eager API (api.py), the
training Function (function.py) and the torch.compile operator (compiled.py) all call
`prepare`, so they cannot drift apart. The operator's schema is derived from the fields below:
each carries an `OpArg` saying how it travels through a graph (its schema type, and how it is
turned into that and back), so adding an option is one field here plus where it is used.

The environment's configuration is read here only (`prepare`: the call's `config`, else
`config.current()`), and passed down as values.
"""

from __future__ import annotations

import ast
import functools
import warnings
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, fields, replace
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from ...config import RingConfig, current
from ..agree import CallSpec, Problem, agree, digest, needs_grad
from ..training.forward import BlockCall
from ..comm import RingPosition
from ..packed.doc_split import ROW, normal_split
from ..packed.pick import Documents, PackedRow, doc_plan
from ..inference.loop import RingCall
from ..head_start import ring_pause_us
from ..kernels import BlockKernel, KernelChoice, SwappedKernel, resolve_kernel
from ..tensor_layout import Layout, get_layout
from ..agreed_ring import Ring
from ..schedules import NON_CAUSAL, block_schedule
from ..split.sharding import call_layout

__all__ = [
    "CallOptions", "OpArg", "PreparedCall", "prepare", "op_args",
    "refuse_callable_kernel",
]  # fmt: skip

JOINT_STRATEGIES = ("front", "rear")


# --- how an option travels through a compiled graph (compiled.py derives its schema) ----------


@dataclass(frozen=True)
class OpArg:
    """An option as an argument of the `tokenring::attn` operator: its schema type, `encode`
    (runs in traced code: option -> argument) and `decode` (runs in the op: argument ->
    option). `schema=None`: not carried (the option has no meaning under compile)."""

    schema: str | None
    encode: Callable[[Any], Any] = lambda x: x
    decode: Callable[[Any], Any] = lambda x: x


def _group_name(group: dist.ProcessGroup | None) -> str:
    return "" if group is None else group.group_name


def _group(name: str) -> dist.ProcessGroup | None:
    if not name:
        return None
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name)


def refuse_callable_kernel(kernel) -> str:
    """The kernel's name; NotImplementedError for one a graph cannot carry (a Python callable)."""
    if not isinstance(kernel, str):
        raise NotImplementedError(
            "TokenRing under torch.compile takes a kernel by name ('auto' or one of "
            "tokenring_xdit.ring.kernels.KERNELS / kernels.PAIRS), not a Python "
            f"callable ({type(kernel).__name__}): a callable cannot be a constant of the "
            "compiled graph. Pass its name, or call this attention outside torch.compile "
            "(torch.compiler.disable)"
        )
    return kernel


_CONFIG_NAMES = tuple(f.name for f in fields(RingConfig))


def _encode_config(cfg: RingConfig | None) -> str:
    # the fields as a Python literal (Dynamo folds this on constants; the graph guards on them)
    return "" if cfg is None else repr(tuple(getattr(cfg, name) for name in _CONFIG_NAMES))


@functools.lru_cache(maxsize=64)
def _decode_config(text: str) -> RingConfig | None:
    if not text:
        return None
    return RingConfig(**dict(zip(_CONFIG_NAMES, ast.literal_eval(text), strict=True)))


def _cu_tensor(cu_seqlens):
    if cu_seqlens is None or isinstance(cu_seqlens, torch.Tensor):
        return cu_seqlens
    return torch.tensor(list(cu_seqlens), dtype=torch.int64)


def _opt(default, schema: str | None, encode=None, decode=None):
    op = OpArg(schema, *(f for f in (encode, decode) if f is not None))
    return field(default=default, metadata={"op": op})


# --- the options ------------------------------------------------------------------------------


# Not frozen, read-only by convention: built on every call, and a frozen dataclass's __init__
# (object.__setattr__ per field) cost ~3 us more per call, measured on the eager path.
@dataclass(kw_only=True, slots=True)
class CallOptions:
    """What one `token_ring_attn` call asks (its keyword arguments), with q, k, v:

    q: (batch_size, seqlen_q, nheads, headdim) with layout="bshd", or (batch_size, nheads,
    seqlen_q, headdim) with layout="bhsd"; this rank's queries. k: (batch_size, seqlen_k,
    nheads_k, headdim) in the same layout, this rank's keys; seqlen_k may differ from seqlen_q
    (a KV cache) and from other ranks' lengths; nheads must be a multiple of nheads_k (GQA/MQA).
    v: (batch_size, seqlen_k, nheads_k, headdim_v) in the same layout.

    group: the ring's process group; None: the default (world) group.
    layout: "bshd" or "bhsd" (or a `Layout`).
    softmax_scale: float. Default 1 / sqrt(headdim).
    causal: causal attention over zigzag shards (rank r holds chunks r and 2N-1-r of 2N): cut
        them with `tokenring_xdit.shard(x, group, causal=True)` (or yunchang's
        EXTRACT_FUNC_DICT["token_ring"]), or pass `positions`.
    kernel: a name from `kernels.KERNELS`, "auto", or a callable (q, k, v, scale, layout) ->
        (out, lse fp32); a `KeyedKernel` names itself for the CUDA-graph cache, a plain callable
        needs `kernel_key` to be graphed. Training: "auto" or a name from
        `kernels.PAIRS`; packed documents also "masked" or "flash_varlen".
    final_chunks: pieces of the last partial's return (overrides config's).
    joint_kv: (key, value), extra K/V (xDiT's joint text tokens) of shape (batch_size,
        seqlen_j, nheads_k, headdim[_v]) that this rank's own queries attend exactly once,
        joined before ("front") or after ("rear", `joint_strategy`) the local K/V in the step-0
        block. Inference only.
    cuda_graph: replay a CUDA graph per input signature (overrides config's: `cuda_graphs` for
        no-grad non-causal calls, `train_cuda_graph` for training and causal ones).
    kernel_key: names a callable kernel for the CUDA-graph cache.
    config: a `RingConfig`; None: the environment's (`tokenring_xdit.config`).
    deterministic: training path only: a deterministic backward pair.
    positions: (seqlen_q,) or (batch_size, seqlen_q) int, the global token positions of this
        shard: the proof of a causal call's zigzag layout.
    cu_seqlens: (num_docs + 1,) int offsets of packed documents in the WHOLE global sequence
        (0, ..., S; flash-attn's convention), equal on every rank; keep them on the CPU (read
        on the host). Attention stays inside each document.
    position_ids: (seqlen_q,) or (batch_size, seqlen_q) int, this shard's per-document
        positions that restart at 0 where a document starts (transformers' packed batches);
        every rank learns the same documents from them in the input check.
    doc_layout: the layout of packed shards: None (what `shard(..., cu_seqlens=)` declared for
        these documents on this group; the row's split if nothing was), "zigzag" (the row's
        split), "documents" (every document in 2N pieces, ring/packed/doc_split.py; needs
        cu_seqlens) or "contiguous" (a causal row in N contiguous shards,
        schedules/contiguous.py; needs cu_seqlens; not causal it is the row's split). A value
        that contradicts the declaration is refused on every rank.

    Packed documents: non-causal shards are the contiguous shards in rank order, causal ones
    zigzag shards (unless in the documents or the contiguous layout); K/V must be the query's
    tokens; batch size 1; blocks whose tiles share no document are skipped (ring/packed/pick.py).
    Under torch.compile every option travels as an argument of one operator (`OpArg` in each
    field; compiled.py): the kernel by name only, `kernel_key` not at all (it names a callable
    kernel, which a graph cannot carry).
    """

    group: dist.ProcessGroup | None = _opt(None, "str", _group_name, _group)
    layout: str | Layout = _opt("bshd", "str", lambda x: x if isinstance(x, str) else x.name)
    softmax_scale: float | None = _opt(None, "float?")
    causal: bool = _opt(False, "bool")
    kernel: str | BlockKernel = _opt("auto", "str", refuse_callable_kernel)
    final_chunks: int | None = _opt(None, "int?")
    joint_kv: tuple[torch.Tensor, torch.Tensor] | None = _opt(
        None, "Tensor[]", lambda x: [] if x is None else list(x), lambda x: tuple(x) or None
    )
    joint_strategy: str = _opt("rear", "str")
    cuda_graph: bool | None = _opt(None, "bool?")
    kernel_key: Hashable | None = _opt(None, None)
    config: RingConfig | None = _opt(None, "str", _encode_config, _decode_config)
    deterministic: bool = _opt(False, "bool")
    positions: torch.Tensor | None = _opt(None, "Tensor?")
    cu_seqlens: torch.Tensor | list[int] | None = _opt(None, "Tensor?", _cu_tensor)
    position_ids: torch.Tensor | None = _opt(None, "Tensor?")
    doc_layout: str | None = _opt(None, "str?")

    @property
    def packed(self) -> bool:
        return self.cu_seqlens is not None or self.position_ids is not None


def op_args() -> tuple[tuple[str, OpArg], ...]:
    """(name, OpArg) of every option a compiled graph carries, in the operator's order."""
    return tuple((f.name, f.metadata["op"]) for f in fields(CallOptions) if f.metadata["op"].schema)


# --- the kernel ---------------------------------------------------------------------------------


def _documents(options: CallOptions) -> tuple[Documents | None, Problem, str]:
    """(checked documents from cu_seqlens, problem, its text) for the input check."""
    cu_seqlens, position_ids = options.cu_seqlens, options.position_ids
    if cu_seqlens is None:
        if position_ids is not None and not isinstance(position_ids, torch.Tensor):
            return None, Problem.POSITION_IDS, ""
        return None, Problem.NONE, ""
    try:
        return Documents.of(cu_seqlens), Problem.NONE, ""
    except (ValueError, TypeError) as exc:
        return None, Problem.CU_SEQLENS, str(exc).splitlines()[0][:300]


# --- prepare ------------------------------------------------------------------------------------


class PreparedCall(NamedTuple):
    """One call after its input check: everything the loops run, equal on every ring rank
    (except the ring's rank and handles). `call` is a BlockCall (`train`: causal, gradients or
    packed documents; the block-schedule path) or a RingCall (no-grad non-causal inference; its
    layout is the agreed wire layout, `layout` the caller's)."""

    ring: Ring
    call: BlockCall | RingCall
    train: bool
    layout: Layout
    kernel: KernelChoice
    graphs: bool  # replay CUDA graphs (inference with a graph-keyed kernel; train_cuda_graph)
    joint_kv: tuple[torch.Tensor, torch.Tensor] | None
    spec: CallSpec  # what this rank asked (the agreed header is made of it)


def prepare(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    options: CallOptions,
    *,
    grad: bool | None = None,
    validate: str = "",
) -> PreparedCall:
    """Check `options` on every ring rank at once (the same error everywhere, before any
    transfer) and return the prepared call. `grad`: autograd wants gradients (None: from the
    tensors; the compiled operator says so, its tensors never require grad); `validate`
    overrides the config's mode (an adapter's need, e.g. diffusers' uneven shards)."""
    cfg = options.config if options.config is not None else current()
    validate = validate or cfg.validate  # no per-call copy of the config for an override
    layout = get_layout(options.layout)
    if options.joint_strategy not in JOINT_STRATEGIES:
        strategy = options.joint_strategy
        raise ValueError(f"joint_strategy must be 'front' or 'rear', got {strategy!r}")
    chunks = options.final_chunks if options.final_chunks is not None else cfg.final_chunks
    scale = options.softmax_scale if options.softmax_scale is not None else q.shape[-1] ** -0.5
    docs, problem, text = _documents(options)
    pos = RingPosition.of(options.group)
    split, why = ROW, ""
    if options.packed or options.doc_layout is not None:
        total = q.shape[layout.seq_dim] * pos.size
        split, why = call_layout(options.group, docs, options.doc_layout, total)
        split = normal_split(split, options.causal, pos.size)
    if why and not problem:
        problem, text = Problem.DOC_LAYOUT, why
    grad = needs_grad(q, k, v) if grad is None else grad
    packed = options.packed
    train = options.causal or grad or packed
    # a packed call's `auto` kernel: from the documents, ring size and layout (all agreed below)
    row = PackedRow(docs, pos.size, options.causal, split) if packed and docs is not None else None
    kernel = resolve_kernel(
        options.kernel, options.kernel_key, q, k, v, layout,
        train=train, deterministic=options.deterministic, packed=packed, row=row,
    )  # fmt: skip
    if kernel.problem or not problem:
        problem, text = kernel.problem, kernel.problem_text
    graphs = _graphs(options.cuda_graph, cfg, train, kernel.key)
    spec = CallSpec(
        q, k, v, layout, options.causal, chunks, scale, digest(kernel.family), graphs,
        validate, options.joint_kv, options.positions, problem, text, transport=cfg.transport,
        documents=docs, doc_positions=options.position_ids if options.cu_seqlens is None else None,
        timeout=cfg.timeout, family=kernel.family, split=split,
    )  # fmt: skip
    ring = _agree(spec, pos, grad, cfg)
    head_start_us = ring_pause_us(cfg.comm_head_start_us, ring.transport)
    if train:
        schedule = block_schedule(options.causal, ring.split)
        plan = None
        if ring.docs is not None:
            plan = doc_plan(ring.docs, schedule, ring.q_lens, ring.split)
        call = BlockCall(schedule, kernel.fn, layout, scale, plan, head_start_us=head_start_us,
                         hold_back=cfg.train_hold_back)  # fmt: skip
    else:
        call = _ring_call(kernel, layout, ring, scale, chunks, options, cfg, head_start_us)
    return PreparedCall(ring, call, train, layout, kernel, graphs, options.joint_kv, spec)


def _graphs(asked: bool | None, cfg: RingConfig, train: bool, kernel_key) -> bool:
    """Replay CUDA graphs: the call's `cuda_graph=`, else the config's (train_cuda_graph for
    the block-schedule path, cuda_graphs for inference, whose kernel needs a graph key).
    Agreed in the call's header: a capture is collective. Never with expandable segments while
    NCCL registers graph buffers (`RingConfig.graph_register_hazard`): those replays hang."""
    if train:
        wanted = cfg.train_cuda_graph if asked is None else asked
    else:
        wanted = (cfg.cuda_graphs if asked is None else asked) and kernel_key is not None
    if wanted and cfg.graph_register_hazard:
        _warn_graph_register_hazard()
        return False
    return wanted


@functools.cache
def _warn_graph_register_hazard() -> None:
    warnings.warn(
        "TokenRing runs without CUDA graphs: PYTORCH_CUDA_ALLOC_CONF has expandable_segments:True "
        "and NCCL registers graph buffers, under which graphed NCCL transfers hang "
        "(pytorch/pytorch#158029; a graphed ring replay never finished in our soak). Set "
        "NCCL_GRAPH_REGISTER=0 to keep the graphs (measured: 10^4 graphed calls ran)",
        stacklevel=4,
    )


def _agree(spec: CallSpec, pos: RingPosition, grad: bool, cfg: RingConfig) -> Ring:
    """agree(), with the gradient mode the header carries taken from `grad` where the tensors
    do not say it (inside the compiled operator): a detached q that requires grad says it."""
    if not grad or needs_grad(spec.q, spec.k, spec.v) or not spec.q.is_floating_point():
        return agree(spec, pos, comm=cfg.comm)
    with torch.enable_grad():
        return agree(replace(spec, q=spec.q.detach().requires_grad_()), pos, comm=cfg.comm)


def _ring_call(kernel, layout, ring, scale, chunks, options, cfg, head_start_us) -> RingCall:
    # Q and partials travel in the agreed wire layout: the other one where q is stored with
    # seq and heads swapped (xDiT's (b, h, s, d) views of (b, s, h, d) projections), so neither
    # q nor the output is copied; the output then keeps q's storage order, as SDPA's does.
    wire = layout.other if ring.swapped else layout
    return RingCall(
        schedule=NON_CAUSAL,
        kernel=kernel.fn if wire is layout else SwappedKernel(kernel.fn, layout),
        kernel_key=kernel.key,
        layout=wire,
        scale=scale,
        chunks=min(chunks, min(ring.q_lens)),  # equal piece count on every rank
        joint_strategy=options.joint_strategy,
        fused_merge=cfg.fused_merge,
        defer_own=cfg.defer_own,
        head_start_us=head_start_us,
    )
