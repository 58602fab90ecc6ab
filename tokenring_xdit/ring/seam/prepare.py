"""One TokenRing call, prepared the same way for every entry.

`CallOptions` holds what a caller may ask of one call (the keyword arguments of `token_ring_attn`,
documented on the class); `prepare(q, k, v, options)` turns them into a `PreparedCall`: the call's
split and its proof (`agree.proof.call_split`), a packed call's kernels priced (ring/packed/),
the kernel resolved (`kernel_choice.resolve_kernel`), the input check agreed across the ring
(`agree`: the ring, with a packed call's plan), what travels (travel.py), the loop's call object
(a BlockCall, a KvCall or a RingCall, with a window's plan where there is one) and the settings
the runner needs. The eager API (api.py), the training Function and the torch.compile operator
(compiled_op.py) all call `prepare`, so they cannot drift apart. The operator's schema is derived
from the fields below: each carries an `OpArg` saying how it travels through a graph (its schema
type, and how it is turned into that and back), and an option ranks must agree on says so on its
field (`agreed=`), so adding an option is one field here plus where it is used.

The environment's configuration is read here only (`prepare`: the call's `config`, else
`config.current()`), and passed down as values.
"""

from __future__ import annotations

import ast
import functools
import operator
import warnings
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from ...config import AUTO_GRAPH_TOKENS, RingConfig, current
from .. import packed
from ..agree import CallSpec, agree, digest, needs_grad
from ..agree.problems import Problem
from ..agree.proof import call_split
from ..agreed_ring import Ring
from ..comm import RingPosition
from ..head_start import ring_pause_us
from ..inference.loop import RingCall
from ..kernels import BlockKernel, SwappedKernel
from ..packed.kv_plan import kv_plan
from ..packed.window_plan import window_plan
from ..schedules import NON_CAUSAL, block_schedule
from ..schedules.kv_both_ways import split_by_heads
from ..schedules.window import Window
from ..split.value import Split
from ..tensor_layout import Layout, get_layout
from ..training.forward import BlockCall
from ..training.kv_halves import KvCall
from .kernel_choice import KernelChoice, resolve_kernel
from .travel import TRAVELS, resolve_travel

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


def _opt(default, schema: str | None, encode=None, decode=None, agreed: Callable | None = None):
    """A CallOptions field: how it travels through a graph (`OpArg`), and `agreed`: every ring
    rank must pass the same; `agreed(value)` is what is compared (hashable, with a stable repr:
    it joins the header's options digest, and a mismatch is one error naming the option). An
    agreed option is one field here and the code that uses it: nothing in agree/ names it."""
    op = OpArg(schema, *(f for f in (encode, decode) if f is not None))
    return field(default=default, metadata={"op": op, "agreed": agreed})


def _words_or_ints(value) -> tuple | str:
    """A sequence of ints as a tuple (what ranks compare), else its repr (refused later)."""
    try:
        return tuple(operator.index(x) for x in value)  # (2.5 is not an int: its repr)
    except TypeError:
        return repr(value)


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
    causal: causal attention over zigzag shards (rank r holds chunks r and 2N-1-r of 2N): pass
        the split they were cut by (`split`), or `positions`.
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
    split: the `Split` the shards were cut by (`tokenring_xdit.make_split`; ring/split/): kind,
        global length, ring size, packed documents, proof; equal on every rank, agreed. None:
        no claim (a causal call then needs `positions`).
    positions: (seqlen_q,) or (batch_size, seqlen_q) int, this shard's global token positions:
        a causal call's proof of zigzag shards without `split`, checked against it with one.
    cu_seqlens: (num_docs + 1,) int offsets of packed documents in the WHOLE global sequence
        (0, ..., S; flash-attn's convention), equal on every rank, on the CPU (read on the
        host); the split's documents where it has none (a tensor: no graph bakes them in).
    position_ids: (seqlen_q,) or (batch_size, seqlen_q) int, this shard's per-document
        positions that restart at 0 where a document starts (transformers' packed batches);
        every rank learns the same documents from them in the input check.
    travel: what moves round the ring on the training (block-schedule) path: "q" (TokenRing:
        queries travel, partials come home), "kv" (K/V halves both ways, ring/schedules/
        kv_both_ways.py: fewer bytes under GQA), "auto" (predicted per call from the agreed
        shapes, seam/travel.py). Agreed. Inference always moves queries.
    window_size: (left, right), flash-attn's sliding window: query i sees keys i - left ..
        i + right (global positions; -1: unbounded; a causal window of W tokens is (W - 1, 0)).
        Agreed. Runs the block-schedule path, which skips the blocks outside the window and the
        transfers nobody needs (schedules/window.py).

    Packed documents: without a split, non-causal shards are the contiguous shards in rank
    order, causal ones zigzag shards proved by `positions`; K/V must be the query's tokens;
    batch size 1; blocks whose tiles share no document are skipped (ring/packed/).
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
    # without its documents (compiled_op.compiled_attn moves them into cu_seqlens)
    split: Split | None = _opt(None, "Tensor?", lambda s: None if s is None else s.encoded(),
                               lambda t: None if t is None else Split.decoded(t))  # fmt: skip
    positions: torch.Tensor | None = _opt(None, "Tensor?")
    cu_seqlens: torch.Tensor | list[int] | None = _opt(None, "Tensor?", _cu_tensor)
    position_ids: torch.Tensor | None = _opt(None, "Tensor?")
    travel: str = _opt("auto", "str", agreed=str)
    window_size: tuple[int, int] = _opt((-1, -1), "int[]", list, tuple, agreed=_words_or_ints)


AGREED = tuple((f.name, f.metadata["agreed"]) for f in fields(CallOptions) if f.metadata["agreed"])
_DEFAULTS = CallOptions()
# the agreed values of a call that passes none of them (most calls: no per-call work)
_DEFAULT_AGREED = tuple((name, agreed(getattr(_DEFAULTS, name))) for name, agreed in AGREED)


def _agreed(options: CallOptions) -> tuple:
    """((name, value), ...) of the agreed options, as ranks compare them."""
    if options.travel == "auto" and options.window_size == (-1, -1):
        return _DEFAULT_AGREED
    return tuple((name, agreed(getattr(options, name))) for name, agreed in AGREED)


def op_args() -> tuple[tuple[str, OpArg], ...]:
    """(name, OpArg) of every option a compiled graph carries, in the operator's order."""
    return tuple((f.name, f.metadata["op"]) for f in fields(CallOptions) if f.metadata["op"].schema)


# --- prepare ------------------------------------------------------------------------------------


class PreparedCall(NamedTuple):
    """One call after its input check: everything the loops run, equal on every ring rank
    (except the ring's rank and handles). `call` is a BlockCall (`train`: causal, gradients or
    packed documents; the block-schedule path), a KvCall (the same calls where K/V travel,
    seam/travel.py) or a RingCall (no-grad non-causal inference; its
    layout is the agreed wire layout, `layout` the caller's)."""

    ring: Ring
    call: BlockCall | KvCall | RingCall
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
    layout = get_layout(options.layout)
    if options.joint_strategy not in JOINT_STRATEGIES:
        strategy = options.joint_strategy
        raise ValueError(f"joint_strategy must be 'front' or 'rear', got {strategy!r}")
    pos = RingPosition.of(options.group)
    grad = needs_grad(q, k, v) if grad is None else grad
    window, refused = _window(options)
    if options.travel not in TRAVELS:  # (refused on every rank, by the input check)
        refused = f"travel must be one of {TRAVELS}, got {options.travel!r}"
    spec, kernel = _spec(q, k, v, options, layout, pos, grad, cfg, validate or cfg.validate,
                         window, refused)  # fmt: skip
    train = spec.train
    ring = agree(spec, pos, comm=cfg.comm)
    head_start_us = ring_pause_us(cfg.comm_head_start_us, ring.transport)
    if train and resolve_travel(options.travel, ring, spec, window is not None) == "kv":
        by_heads = split_by_heads(k.shape[layout.head_dim])
        docs = ring.plan.docs if ring.plan is not None else None  # (the row's split: travel.py)
        plan = None  # dense, no window: the whole table
        if docs is not None or window is not None:
            plan = kv_plan(docs, ring.q_lens, options.causal, by_heads, window)
        call = KvCall(kernel.fn, layout, spec.scale, options.causal, by_heads, plan=plan)
    elif train:
        plan = ring.plan
        if window is not None:  # the window's plan: its skips, over the documents' if packed
            cut = spec.split.layout(options.causal, ring.size)
            docs = plan.docs if plan is not None else None
            plan = window_plan(window, options.causal, ring.q_lens, cut, docs)
        call = BlockCall(
            schedule=plan.schedule if plan is not None else block_schedule(options.causal),
            pair=kernel.fn, layout=layout, scale=spec.scale, plan=plan,
            head_start_us=head_start_us, hold_back=cfg.train_hold_back,
        )  # fmt: skip
    else:
        call = _ring_call(kernel, layout, ring, spec, options, cfg, head_start_us)
    graphs = spec.graphs if spec.graphs is not None else _auto_graphs(ring, q)
    return PreparedCall(ring, call, train, layout, kernel, graphs, options.joint_kv, spec)


def _window(options: CallOptions) -> tuple[Window | None, str]:
    """The call's sliding window (None: none), or why `window_size` is refused."""
    if options.window_size == (-1, -1):
        return None, ""
    try:
        return Window.of(options.window_size, options.causal), ""
    except ValueError as exc:
        return None, str(exc)


def _spec(
    q, k, v, options, layout, pos, grad, cfg, validate, window, refused
) -> tuple[CallSpec, KernelChoice]:
    """What this rank asks (the header is made of it) and its kernel: the call's split (and its
    problem), a packed call's kernels priced, the kernel resolved."""
    q_len = q.shape[layout.seq_dim] if q.dim() == 4 else 0
    split, problem, text = call_split(options, pos.rank, pos.size, q_len)
    by_ids = options.position_ids if split.docs is None else None  # documents from claims
    packed = split.docs is not None or by_ids is not None
    train = options.causal or grad or packed or window is not None  # the block-schedule path
    kernel = resolve_kernel(
        options.kernel, options.kernel_key, q, k, v, layout, train=train,
        deterministic=options.deterministic, packed=packed,
        order=_priced(split, options, pos.size) if packed else (), windowed=window is not None,
    )  # fmt: skip
    if kernel.problem or not problem:
        problem, text = kernel.problem, kernel.problem_text
    if refused and not kernel.problem:  # (before the split's: the simpler mistake)
        problem, text = Problem.OPTION, refused
    chunks = options.final_chunks if options.final_chunks is not None else cfg.final_chunks
    scale = options.softmax_scale if options.softmax_scale is not None else q.shape[-1] ** -0.5
    spec = CallSpec(
        q=q, k=k, v=v, layout=layout, causal=options.causal, chunks=chunks, scale=scale,
        kernel=digest(kernel.family), family=kernel.family, validate=validate,
        graphs=_graphs(options.cuda_graph, cfg, train, kernel.key), train=train,
        joint_kv=options.joint_kv, grad=grad, split=split, doc_positions=by_ids, problem=problem,
        detail=text, transport=cfg.transport, timeout=cfg.timeout,
        agreed=_agreed(options),
    )  # fmt: skip
    return spec, kernel


def _priced(split: Split, options: CallOptions, size: int) -> tuple[str, ...]:
    """The packed kernels `auto` may run, fastest predicted first: priced once per call, from
    the split and its documents (all agreed), or the table's order where the documents come
    later (position ids) or a deterministic call keeps the first."""
    if split.docs is None or options.deterministic:
        return packed.PRICED
    layout = split.layout(options.causal, size)
    return packed.kernel_order(split.docs, size, options.causal, layout)


def _graphs(asked: bool | None, cfg: RingConfig, train: bool, kernel_key) -> bool | None:
    """Replay CUDA graphs: the call's `cuda_graph=`, else the config's (train_cuda_graph for
    the block-schedule path, cuda_graphs for inference, whose kernel needs a graph key); None:
    `auto` (training), decided from the agreed lengths (`_auto_graphs`). Agreed in the call's
    header: a capture is collective. Never with expandable segments while NCCL registers graph
    buffers (`RingConfig.graph_register_hazard`): those replays hang."""
    if train:
        wanted = cfg.train_cuda_graph if asked is None else asked
    else:
        wanted = (cfg.cuda_graphs if asked is None else asked) and kernel_key is not None
    if wanted is not False and cfg.graph_register_hazard:
        if wanted:
            _warn_graph_register_hazard()
        return False
    return wanted


def _auto_graphs(ring: Ring, q: torch.Tensor) -> bool:
    """`auto` training graphs: on CUDA where every rank holds few enough queries that launch
    gaps cost more than a graph's copies (config.AUTO_GRAPH_TOKENS; agreed lengths)."""
    return q.device.type == "cuda" and ring.size > 1 and max(ring.q_lens) <= AUTO_GRAPH_TOKENS


@functools.cache
def _warn_graph_register_hazard() -> None:
    warnings.warn(
        "TokenRing runs without CUDA graphs: PYTORCH_CUDA_ALLOC_CONF has expandable_segments:True "
        "and NCCL registers graph buffers, under which graphed NCCL transfers hang "
        "(pytorch/pytorch#158029; a graphed ring replay never finished in our soak). Set "
        "NCCL_GRAPH_REGISTER=0 to keep the graphs (measured: 10^4 graphed calls ran)",
        stacklevel=4,
    )


def _ring_call(kernel, layout, ring, spec, options, cfg, head_start_us) -> RingCall:
    # Q and partials travel in the agreed wire layout: the other one where q is stored with
    # seq and heads swapped (xDiT's (b, h, s, d) views of (b, s, h, d) projections), so neither
    # q nor the output is copied; the output then keeps q's storage order, as SDPA's does.
    wire = layout.other if ring.swapped else layout
    return RingCall(
        schedule=NON_CAUSAL,
        kernel=kernel.fn if wire is layout else SwappedKernel(kernel.fn, layout),
        kernel_key=kernel.key,
        layout=wire,
        scale=spec.scale,
        chunks=min(spec.chunks, min(ring.q_lens)),  # equal piece count on every rank
        joint_strategy=options.joint_strategy,
        fused_merge=cfg.fused_merge,
        defer_own=cfg.defer_own,
        head_start_us=head_start_us,
    )
