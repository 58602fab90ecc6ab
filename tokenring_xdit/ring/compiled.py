"""TokenRing under torch.compile: the whole ring call is one opaque operator.

Dynamo cannot trace the ring (kernel probes, digests, the input check's all-gather, P2P ops,
bounded waits) and must not: every piece of it decides or moves data across ranks. So while
Dynamo traces (`torch.compiler.is_compiling()`), `token_ring_attn` hands its call here and the
graph gets one node, `tokenring::attn`, a `torch.library.custom_op`:

- its fake (meta) implementation gives out (q's layout, v's head size) and lse (b, h, s) fp32
  without communicating, so Dynamo/AOTAutograd/Inductor trace around it without graph breaks;
- its real implementation, run by the compiled program, is the eager ring call itself (input
  check agreed across the ring, caches, the ring's own CUDA graphs and communicators), so
  compiled and eager calls compute the same thing;
- training: `register_autograd` pairs it with `tokenring::attn_backward`, the block-schedule
  backward loop. The backward re-runs the input check (the compiled program keeps no Python
  object between forward and backward; the check's cache makes that cheap on NCCL rings).
- both carry the `cudagraph_unsafe` tag where torch has it: `mode="reduce-overhead"` then keeps
  CUDA graphs around the ring (Inductor's graph partitions) and runs the ring outside them. A
  ring call met inside someone else's stream capture is refused with one clear error
  (`_refuse_capture`), before anything is sent.

The eager path never comes here: outside compilation the only cost is the one
`is_compiling()` test at the top of `token_ring_attn` (a flag read).

Arguments the operator cannot carry (the schema takes tensors, numbers, strings): the process
group travels by name (`ProcessGroup.group_name`, resolved back in the op), the layout by name,
a `RingConfig` as the fields a call reads (`_CONFIG_FIELDS`, "unset" markers for the
environment's), and the kernel only by NAME: a Python-callable block kernel cannot be a graph
constant, so under compile hosts map theirs to a named kernel (`hosts/*`), and a direct call
with one gets a NotImplementedError saying so.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..config import RingConfig, current

__all__ = ["compiled_attn", "refuse_callable_kernel", "count_host_calls_with"]

_TAGS = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()
_UNSET = -1  # an int field the environment decides
_CONFIG_FIELDS = ("final_chunks", "cuda_graphs", "validate", "transport", "fused_merge")
# hosts/calls.count_call, registered by the host adapters (ring/ imports no host code). A host
# counts its compiled calls here, at run time: a counter bumped in traced code would be a
# guard on its value, and every call would recompile.
_HOST_COUNTERS: list = []


# api.token_ring_attn and api._resolve_kernel, handed over by api at import (api dispatches here
# while Dynamo traces, so this module cannot import api)
_EAGER: dict = {}


def use_eager(token_ring_attn, resolve_kernel) -> None:
    _EAGER.update(token_ring_attn=token_ring_attn, resolve_kernel=resolve_kernel)


def count_host_calls_with(counter) -> None:
    """Count compiled calls made on behalf of a host with counter(host) (idempotent)."""
    if counter not in _HOST_COUNTERS:
        _HOST_COUNTERS.append(counter)


def refuse_callable_kernel(kernel) -> None:
    """NotImplementedError for a kernel the compiled op cannot carry (a Python callable)."""
    if not isinstance(kernel, str):
        raise NotImplementedError(
            "TokenRing under torch.compile takes a kernel by name ('auto' or one of "
            "tokenring_xdit.ring.kernels.KERNELS / backward_kernels.PAIRS), not a Python "
            f"callable ({type(kernel).__name__}): a callable cannot be a constant of the "
            "compiled graph. Pass its name, or call this attention outside torch.compile "
            "(torch.compiler.disable)"
        )


def compiled_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    layout="bshd",
    softmax_scale: float | None = None,
    causal: bool = False,
    kernel="auto",
    final_chunks: int | None = None,
    joint_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    joint_strategy: str = "rear",
    cuda_graph: bool | None = None,
    config: RingConfig | None = None,
    deterministic: bool = False,
    positions: torch.Tensor | None = None,
    validate: str = "",
    host: str = "",
) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_ring_attn` while Dynamo traces (same arguments and results; runs in traced code,
    so it only turns them into the operator's schema). `validate` overrides the config's;
    `host`: the adapter the call is counted for (`tokenring_xdit.calls_by_host()`)."""
    refuse_callable_kernel(kernel)
    train = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    jk, jv = joint_kv if joint_kv is not None else (None, None)
    chunks = final_chunks if final_chunks is not None else _UNSET
    graphs = _UNSET if cuda_graph is None else int(cuda_graph)
    transport, fused = "", _UNSET
    if config is not None:
        chunks = config.final_chunks if final_chunks is None else chunks
        graphs = int(config.cuda_graphs) if cuda_graph is None else graphs
        validate = validate or config.validate
        transport, fused = config.transport, int(config.fused_merge)
    out, lse = torch.ops.tokenring.attn(
        q, k, v, jk, jv, positions,
        "" if group is None else group.group_name,
        layout if isinstance(layout, str) else layout.name,
        softmax_scale, causal, kernel, chunks, joint_strategy, graphs, validate, transport,
        fused, deterministic, train, host,
    )  # fmt: skip
    return out, lse.detach()  # as in eager: lse takes no gradient


# --- the operator's real side (runs eagerly inside the compiled program) ----------------------


def _group(name: str) -> dist.ProcessGroup | None:
    if not name:
        return None
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name)


def _config(chunks: int, graphs: int, validate: str, transport: str, fused: int) -> RingConfig:
    """The environment's configuration with the fields the caller fixed."""
    cfg, changes = current(), {}
    if chunks != _UNSET:
        changes["final_chunks"] = chunks
    if graphs != _UNSET:
        changes["cuda_graphs"] = bool(graphs)
    if fused != _UNSET:
        changes["fused_merge"] = bool(fused)
    if validate:
        changes["validate"] = validate
    if transport:
        changes["transport"] = transport
    return cfg.replace(**changes) if changes else cfg


def _refuse_capture(q: torch.Tensor) -> None:
    """The ring exchanges its input check on the CPU and waits on the host: it cannot be
    recorded into a CUDA graph someone else is capturing (on torch without graph partitions,
    `mode="reduce-overhead"` would try). Every rank captures at the same point, so every rank
    raises here, before anything is sent."""
    if q.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "TokenRing cannot run inside a CUDA graph captured by someone else (e.g. "
            "torch.compile(mode='reduce-overhead') on a torch without the cudagraph_unsafe "
            "tag / Inductor graph partitions). Compile with mode='default' or "
            "'max-autotune-no-cudagraphs'; TokenRing replays its own CUDA graphs "
            "(TOKENRING_XDIT_CUDA_GRAPHS=1)"
        )


def _block_call(q, k, v, group, layout, scale, causal, kernel, deterministic, positions, cfg,
                joint_kv=None):  # fmt: skip
    """(BlockCall, agreed Ring) of a training call: the same kernel pair and input check the
    eager training path uses (api.token_ring_attn), without its autograd Function."""
    from .agree import CallSpec, Problem, agree, digest
    from .block_forward import BlockCall
    from .comm import RingPosition
    from .head_start import ring_pause_us
    from .layout import get_layout
    from .schedules import CAUSAL_ZIGZAG, NON_CAUSAL_BLOCKS

    layout = get_layout(layout)
    pos = RingPosition.of(group)
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    resolve = _EAGER["resolve_kernel"]
    pair, _, family, problem = resolve(kernel, None, q, k, v, layout, True, deterministic)
    if joint_kv is not None and not problem[0]:
        # gradients through joint K/V: refused on every rank, as in eager
        problem = (Problem.JOINT_GRAD, "")
    spec = CallSpec(
        q, k, v, layout, causal, cfg.final_chunks, scale, digest(family), False, cfg.validate,
        joint_kv, positions, *problem, transport=cfg.transport, timeout=cfg.timeout,
    )  # fmt: skip
    ring = agree(spec, pos, comm=cfg.comm)
    schedule = CAUSAL_ZIGZAG if causal else NON_CAUSAL_BLOCKS
    call = BlockCall(
        schedule, pair, layout, scale,
        head_start_us=ring_pause_us(cfg.comm_head_start_us, ring.transport),
    )  # fmt: skip
    return call, ring


def _dense(x: torch.Tensor) -> torch.Tensor:
    # the fake implementations promise contiguous outputs; Inductor may rely on the strides
    return x.contiguous()


@torch.library.custom_op("tokenring::attn", mutates_args=(), tags=_TAGS)
def _attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    joint_k: torch.Tensor | None,
    joint_v: torch.Tensor | None,
    positions: torch.Tensor | None,
    group: str,
    layout: str,
    scale: float | None,
    causal: bool,
    kernel: str,
    final_chunks: int,
    joint_strategy: str,
    cuda_graph: int,
    validate: str,
    transport: str,
    fused_merge: int,
    deterministic: bool,
    train: bool,
    host: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    _refuse_capture(q)
    for counter in _HOST_COUNTERS if host else ():
        counter(host)
    cfg = _config(final_chunks, cuda_graph, validate, transport, fused_merge)
    grp = _group(group)
    joint_kv = (joint_k, joint_v) if joint_k is not None else None
    if train:
        from .block_forward import block_forward

        args = (q, k, v, grp, layout, scale, causal, kernel, deterministic, positions, cfg)
        call, ring = _block_call(*args, joint_kv=joint_kv)
        out, lse = block_forward(call, ring, ring.q_lens, q, k, v)
        ring.finished("forward")
        return _dense(out), _dense(lse)
    with torch.no_grad():
        out, lse = _EAGER["token_ring_attn"](
            q, k, v, group=grp, layout=layout, softmax_scale=scale, causal=causal,
            kernel=kernel, joint_kv=joint_kv, joint_strategy=joint_strategy, config=cfg,
            deterministic=deterministic, positions=positions,
        )  # fmt: skip
    return _dense(out), _dense(lse)


@_attn.register_fake
def _attn_fake(q, k, v, joint_k, joint_v, positions, group, layout, *args):
    from .layout import get_layout

    b, s, h, _ = get_layout(layout).dims(q)
    out = q.new_empty((*q.shape[:3], v.shape[3]))
    return out, q.new_empty((b, h, s), dtype=torch.float32)


@torch.library.custom_op("tokenring::attn_backward", mutates_args=(), tags=_TAGS)
def _attn_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    positions: torch.Tensor | None,
    group: str,
    layout: str,
    scale: float | None,
    causal: bool,
    kernel: str,
    validate: str,
    transport: str,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from .backward import block_backward

    _refuse_capture(q)
    cfg = _config(_UNSET, _UNSET, validate, transport, _UNSET)
    grp = _group(group)
    args = (q, k, v, grp, layout, scale, causal, kernel, deterministic, positions, cfg)
    call, ring = _block_call(*args)
    dq, dk, dv = block_backward(call, ring, ring.q_lens, dout, q, k, v, out, lse)
    ring.finished("backward")
    return _dense(dq), _dense(dk), _dense(dv)


@_attn_backward.register_fake
def _attn_backward_fake(dout, q, k, v, *args):
    return tuple(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))


_SAVED_ARGS = ("group", "layout", "scale", "causal", "kernel", "validate", "transport",
               "deterministic")  # fmt: skip
_ARG_INDEX = {"group": 6, "layout": 7, "scale": 8, "causal": 9, "kernel": 10, "validate": 14,
              "transport": 15, "deterministic": 17}  # fmt: skip


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, _, _, positions = inputs[:6]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, positions)
    ctx.args = tuple(inputs[_ARG_INDEX[name]] for name in _SAVED_ARGS)
    ctx.train = inputs[18]


def _backward(ctx, dout, _dlse):
    if not ctx.train:  # only reached if autograd wants gradients the trace said it would not
        raise RuntimeError("tokenring::attn ran without train=True; no backward was prepared")
    q, k, v, out, lse, positions = ctx.saved_tensors
    group, layout, scale, causal, kernel, validate, transport, deterministic = ctx.args
    dq, dk, dv = torch.ops.tokenring.attn_backward(
        dout, q, k, v, out, lse, positions, group, layout, scale, causal, kernel, validate,
        transport, deterministic,
    )  # fmt: skip
    return (dq, dk, dv) + (None,) * 17


_attn.register_autograd(_backward, setup_context=_setup_context)
