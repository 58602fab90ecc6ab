"""TokenRing under torch.compile: the whole ring call is one opaque operator, `tokenring::attn`
(docs/compile.md: entry points, modes, how).

Dynamo cannot trace the ring (kernel probes, digests, the input check's all-gather, P2P ops,
bounded waits) and must not: every piece of it decides or moves data across ranks. So while
Dynamo traces, `api.attend` hands its call here. The fake implementation gives out and lse
without communicating; the real one prepares the call as the eager API does (`prepare`) and runs
the same loops, so compiled and eager calls agree the same header and compute the same thing.
Training pairs it with `tokenring::attn_backward` (`register_autograd`), which re-runs `prepare`:
the compiled program keeps no Python object between forward and backward. Both carry the
`cudagraph_unsafe` tag where torch has it; a ring call met inside someone else's stream capture
is refused with one clear error (`_refuse_capture`) before anything is sent.

Arguments: the schema is derived from `CallOptions` (each field's `OpArg`), then `_EXTRA` (train,
the host the call is counted for, a validate override). The kernel travels by NAME only (a
Python callable cannot be a graph constant: hosts map theirs to a named kernel); a `Split` as a
small tensor, its documents in the cu_seqlens tensor (a new packing compiles nothing new).
"""

from __future__ import annotations

from collections import Counter

import torch

from ..tensor_layout import get_layout
from ..training.run import train_backward, train_forward
from .prepare import CallOptions, op_args, prepare
from .run import infer

__all__ = ["HOST_CALLS", "HostCalls", "compiled_attn", "count_host"]

_TAGS = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()
_OPTIONS = op_args()  # (name, OpArg) in the operator's order
_INDEX = {name: i for i, (name, _) in enumerate(_OPTIONS)}
# what an adapter adds after the options: does autograd want gradients (decided while tracing),
# the host the call is counted for (`tokenring_xdit.calls_by_host()`), a validate override
_EXTRA = (("train", "bool"), ("host", "str"), ("validate", "str"))
_ARGS = ", ".join(f"{op.schema} {name}" for name, op in _OPTIONS)


class HostCalls(Counter):
    """Ring calls run in this process on behalf of each host adapter, by the `host` label it
    passes (`tokenring_xdit.calls_by_host()` reads them): one entry per label (the adapters pass
    three). Compiled calls count here at run time: a counter bumped in traced code would be a
    guard on its value, and every call would recompile."""

    def count(self, host: str) -> None:
        if host:  # "": no host
            self[host] += 1


HOST_CALLS = HostCalls()
count_host = HOST_CALLS.count  # one call made on behalf of `host` ("": none)


def compiled_attn(qkv: tuple[torch.Tensor, ...], options: CallOptions, host: str, validate: str):
    """`api.attend(q, k, v, ...)` while Dynamo traces: (out, lse) as eager; runs in traced
    code, so it only turns the options into the operator's arguments."""
    q, k, v = qkv
    train = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    given, split = {"cu_seqlens": options.cu_seqlens}, options.split
    if given["cu_seqlens"] is None and split is not None and split.docs is not None:
        given["cu_seqlens"] = split.docs.bounds  # (the encoded split has none)
    args = [op.encode(given.get(name, getattr(options, name))) for name, op in _OPTIONS]
    out, lse = torch.ops.tokenring.attn(q, k, v, *args, train, host, validate)
    return out, lse.detach()  # as in eager: lse takes no gradient


# --- the operator's real side (runs eagerly inside the compiled program) ----------------------


def _options(args) -> CallOptions:
    return CallOptions(**{name: op.decode(args[i]) for i, (name, op) in enumerate(_OPTIONS)})


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


def _dense(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    # the fake implementations promise contiguous outputs; Inductor may rely on the strides
    return tuple(x.contiguous() for x in xs)


def _attn(q, k, v, *args):
    train, host, validate = args[len(_OPTIONS) :]
    _refuse_capture(q)
    count_host(host)
    prepared = prepare(q, k, v, _options(args), grad=train, validate=validate)
    if not prepared.train:
        with torch.no_grad():
            return _dense(*infer(prepared, q, k, v))
    ring = prepared.ring
    out, lse = train_forward(prepared.call, ring, ring.q_lens, q, k, v, prepared.graphs)
    return _dense(out, lse)


def _attn_fake(q, k, v, *args):
    b, s, h, _ = get_layout(args[_INDEX["layout"]]).dims(q)
    out = q.new_empty((*q.shape[:3], v.shape[3]))
    return out, q.new_empty((b, h, s), dtype=torch.float32)


def _attn_backward(dout, q, k, v, out, lse, *args):
    _refuse_capture(q)
    prepared = prepare(q, k, v, _options(args), grad=True, validate=args[-1])
    ring, args = prepared.ring, (dout, q, k, v, out, lse, prepared.graphs)
    dq, dk, dv = train_backward(prepared.call, ring, ring.q_lens, *args)
    return _dense(dq, dk, dv)


def _attn_backward_fake(dout, q, k, v, *args):
    return tuple(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))


def _setup_context(ctx, inputs, output) -> None:
    # tensors through save_for_backward, the rest on ctx; lists of tensors (joint K/V) never
    # reach a backward (inference only: a training call with them is refused in the forward)
    options = inputs[3 : 3 + len(_OPTIONS)]
    tensors = [i for i, (_, op) in enumerate(_OPTIONS) if op.schema == "Tensor?"]
    ctx.save_for_backward(*inputs[:3], *output, *(options[i] for i in tensors))
    ctx.tensors = tensors
    kept = zip(_OPTIONS, options, strict=True)
    ctx.args = [[] if op.schema == "Tensor[]" else x for (_, op), x in kept]
    ctx.train, ctx.validate = inputs[3 + len(_OPTIONS)], inputs[-1]
    # no gradient for any other input, in torch's structure: a list for a list of tensors, one
    # None for anything else (an int[] such as window_size is one leaf)
    ctx.no_grads = tuple([None] * len(x) if _tensor_list(x) else None for x in inputs[3:])


def _tensor_list(x) -> bool:
    return isinstance(x, list) and all(t is None or isinstance(t, torch.Tensor) for t in x)


def _backward(ctx, dout, _dlse):
    if not ctx.train:  # only reached if autograd wants gradients the trace said it would not
        raise RuntimeError("tokenring::attn ran without train=True; no backward was prepared")
    q, k, v, out, lse, *saved = ctx.saved_tensors
    args = list(ctx.args)
    for i, x in zip(ctx.tensors, saved, strict=True):
        args[i] = x
    dq, dk, dv = torch.ops.tokenring.attn_backward(dout, q, k, v, out, lse, *args, ctx.validate)
    return (dq, dk, dv, *ctx.no_grads)


_attn_op = torch.library.custom_op(
    "tokenring::attn", _attn, mutates_args=(), tags=_TAGS,
    schema=f"(Tensor q, Tensor k, Tensor v, {_ARGS}, "
    f"{', '.join(f'{t} {n}' for n, t in _EXTRA)}) -> (Tensor, Tensor)",
)  # fmt: skip
_attn_op.register_fake(_attn_fake)
_backward_op = torch.library.custom_op(
    "tokenring::attn_backward", _attn_backward, mutates_args=(), tags=_TAGS,
    schema=f"(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, {_ARGS}, "
    "str validate) -> (Tensor, Tensor, Tensor)",
)  # fmt: skip
_backward_op.register_fake(_attn_backward_fake)
_attn_op.register_autograd(_backward, setup_context=_setup_context)
