"""The ring choice (TokenRing or the host's ring) while torch.compile traces a host's model.

Eagerly, `selection.choose` agrees the choice across the ring on every call (an all-gather on
the ring's CPU communicator). Dynamo must not trace that exchange, and the choice decides which
code the graph contains, so under compile it is made ONCE, while the graph is traced: Dynamo
calls these helpers eagerly (`torch.compiler.assume_constant_result`) and keeps their results
as constants of the graph. Every rank traces the same model at the same point, so the
agreement still happens on every rank before either ring runs, and ranks that chose
differently still fail together with the same ValueError. A later change of the selection
(`set_xdit_ring_impl`, the environment) takes effect when the model is compiled again
(torch._dynamo.reset() or a recompile), not per call; `auto` decides from the shapes traced.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from . import selection

__all__ = ["choose", "choose_traced"]

log = logging.getLogger("tokenring_xdit")
_announced = selection.announced()  # what the traced choice has logged


def choose(group, query: torch.Tensor, q_len: int, kv_len: int, signature, announce) -> str:
    """`selection.choose`, or while Dynamo traces `choose_traced` (the patches call this)."""
    if torch.compiler.is_compiling():
        return choose_traced(group, query, q_len, kv_len, signature)
    return selection.choose(group, query, q_len, kv_len, signature, announce)


def choose_traced(group, query: torch.Tensor, q_len: int, kv_len: int, signature) -> str:
    """`selection.choose` for traced code: TOKEN_RING or DEFAULT, a constant of the graph."""
    impl, source = _selection()
    grad = torch.is_grad_enabled() and query.requires_grad
    lengths = _agree(group.group_name, impl, source, grad, query.dtype, query.device.type,
                     int(q_len), int(kv_len))  # fmt: skip
    if impl != selection.AUTO:
        return impl
    call = signature(*lengths)
    fields = tuple(getattr(call, f.name) for f in dataclasses.fields(call))
    return _decide(fields)


@torch.compiler.assume_constant_result
def _selection() -> tuple[str, str]:
    return selection.xdit_ring_impl()


@torch.compiler.assume_constant_result
def _agree(group_name: str, impl: str, source: str, grad: bool, dtype, device_type: str,
           q_len: int, kv_len: int) -> tuple[int, int]:  # fmt: skip
    """The eager agreement (ring/agree/choice.py), run once at trace time."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    from .. import config
    from ..ring.agree import Choice, agree_ring_choice

    cfg = config.current()
    inputs = None
    if impl == selection.AUTO:
        inputs = selection.auto_inputs(cfg, grad, dtype, device_type)
    group = _resolve_process_group(group_name)
    # "always": a trace is rare, and a cached answer must not stand in for a peer's
    longest = agree_ring_choice(
        group, Choice.of(impl), source, inputs, (q_len, kv_len), torch.device(device_type),
        "always", comm=cfg.comm,
    )  # fmt: skip
    if impl != selection.AUTO:
        selection.log_once(
            log, _announced, (impl, source),
            f"torch.compile: ring attention {impl!r} (selected by {source}), fixed in the graph",
        )  # fmt: skip
    return longest


@torch.compiler.assume_constant_result
def _decide(fields: tuple) -> str:
    call = selection.AutoSignature(*fields)
    decision = selection.decide(call)
    selection.log_once(
        log, _announced, call, "torch.compile: " + selection.describe(call, decision, "host's")
    )
    return decision.impl
