"""The two halves of a block-schedule call (training, causal), eager or replayed as CUDA graphs.

Why graphs: at ring 4 an eager training call loses 7-12 points of the ideal to launch gaps
(docs/performance.md, training). With `RingConfig.train_cuda_graph` (agreed in the call's header)
each half runs through the ring's graph cache (`Ring.graphed`, graph_cache.py) under its own key:
forward run(q, k, v) -> (out, lse), backward run(dout, q, k, v, out, lse) -> (dq, dk, dv). Outputs
are cloned out of the graph, so what autograd saves and gets back are the caller's own tensors,
never buffers a later replay overwrites. Packed documents are graphed too: the key holds the
agreed documents and layout (`BlockCall.packing`), shared by every layer of a step; the ring keeps
the graphs of its last `PACKINGS_KEPT` packings (dropped on every rank at the same call).

Not graphed: a ring of one, a call inside someone else's capture or off CUDA (`graphs_wanted`),
a call autograd records through (create_graph=True). `ring.finished` follows every call.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch

from ..agreed_ring import Ring
from ..graph_cache import graphs_wanted
from .backward import block_backward
from .forward import BlockCall, block_forward
from .kv_backward import kv_backward
from .kv_forward import kv_forward
from .kv_halves import KvCall

TrainCall = BlockCall | KvCall  # what travels: queries (TokenRing) or K/V both ways

__all__ = ["train_backward", "train_forward", "train_graph_key"]

FORWARD, BACKWARD = "train-fwd", "train-bwd"


def train_graph_key(
    ring: Ring, call: TrainCall, half: str, inputs: tuple[torch.Tensor, ...]
) -> Hashable | None:
    """The graph cache key of one half of a call (None: this call is not graphed): `Ring.
    graph_key` of what the call bakes in, the half and the autocast state it is captured under
    (a replay repeats its casts)."""
    baked = call.graph_key()
    if baked is None:
        return None
    device = inputs[0].device.type
    cast = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    return ring.graph_key((baked, half, cast), inputs)


def _run(
    ring: Ring, call: TrainCall, half: str, inputs: tuple[torch.Tensor, ...], run: Callable,
    graphs: bool,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    key = None
    if graphs and ring.size > 1 and graphs_wanted(True, inputs[0].device):
        # (autograd recording through the call, a backward with create_graph, stays eager)
        if not (torch.is_grad_enabled() and any(x.requires_grad for x in inputs)):
            key = train_graph_key(ring, call, half, inputs)
    result = run(inputs) if key is None else ring.graphed(key, inputs, run, call.packing)
    ring.finished("forward" if half == FORWARD else "backward")
    return result


def train_forward(
    call: TrainCall, ring: Ring, q_lens: tuple[int, ...], q, k, v, graphs: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of `block_forward`, then the ring's end-of-call check; `graphs`: through the
    ring's graph cache where this call can be (module docstring)."""

    def run(xs):
        if isinstance(call, KvCall):
            return kv_forward(call, ring, ring.kv_lens, *xs)
        return block_forward(call, ring, q_lens, *xs)

    return _run(ring, call, FORWARD, (q, k, v), run, graphs)


def train_backward(
    call: TrainCall, ring: Ring, q_lens: tuple[int, ...], dout, q, k, v, out, lse,
    graphs: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(dq, dk, dv) of `block_backward`, then the ring's end-of-call check; `graphs` as in
    `train_forward`."""

    def run(xs):
        if isinstance(call, KvCall):
            return kv_backward(call, ring, ring.kv_lens, *xs)
        return block_backward(call, ring, q_lens, *xs)

    return _run(ring, call, BACKWARD, (dout, q, k, v, out, lse), run, graphs)
