"""The two halves of a block-schedule call (training, causal), eager or replayed as CUDA graphs.

At ring 4 an eager training call launches dozens of kernels and NCCL batches per step, and a
per-rank profile put 7-12 points of the ideal into the launch gaps between them
(docs/performance.md, training). With `RingConfig.train_cuda_graph`
(TOKENRING_XDIT_TRAIN_CUDA_GRAPH=1, agreed across the ring in the call's header) each half runs
through the ring's graph cache (`Ring.graphed`, graphs.py) under its own key: the forward
run(q, k, v) -> (out, lse), the backward run(dout, q, k, v, out, lse) -> (dq, dk, dv). A key's
first call runs eagerly, then it is captured once on every rank together (a failed capture is
refused on all of them, counted in `RING_GRAPHS.stats.refused`, and the key stays eager) and
replayed: the inputs are copied into the graph's static buffers and the outputs cloned out, so
what autograd saves for the backward (out, lse) and what it gets back (dq, dk, dv) are the
caller's own tensors, never buffers a later replay overwrites. Every layer of one shape shares a
forward graph and a backward graph.

Packed documents (`BlockCall.plan`) are graphed too: the key holds the agreed documents and
their layout (`BlockCall.packing`), and one packing is shared by every layer of a step, so per
step and half a packing runs eagerly once, is captured once and replays for the other layers.
The ring keeps the graphs of its last `graphs.PACKINGS_KEPT` packings and drops older ones when
a new packing comes (on every rank at the same call: the keys are agreed).

Not graphed (eager as before): a ring of one (a single kernel), a call met inside someone else's capture or on a non-CUDA device (`graphs_wanted`), a call
autograd records through (a backward with create_graph=True). `ring.finished` follows every
call, replayed or not (a replay's deadline error names its step only with
TOKENRING_XDIT_REPLAY_STEP_MARKS=1).
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
