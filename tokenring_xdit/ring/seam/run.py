"""A prepared call run: the block-schedule path with autograd (`train_attn`) or the no-grad
non-causal inference path (`infer`: one rank, the wire layout, CUDA graphs).

Shared by the eager API (api.py) and the compiled operator's real side (compiled_op.py), which
both prepare the call first (prepare.py). The loops below take the prepared call's parts, not
the record, so they need nothing from this floor.
"""

from __future__ import annotations

import torch

from ..graph_cache import graphs_wanted
from ..inference.loop import local_forward, ring_forward
from ..training.function import TokenRingAttention
from .prepare import PreparedCall

__all__ = ["infer", "train_attn"]


def infer(
    prepared: PreparedCall, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of an inference call (`prepared.call` is a RingCall)."""
    call, ring, joint_kv = prepared.call, prepared.ring, prepared.joint_kv
    if ring.size == 1:
        return local_forward(call, q, k, v, joint_kv)
    inputs = (q, k, v) + (tuple(joint_kv) if joint_kv is not None else ())
    swapped = call.layout is not prepared.layout
    if swapped:  # views in the wire layout (call.py: `_ring_call`)
        inputs = tuple(x.transpose(1, 2) for x in inputs)

    def run(xs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        return ring_forward(call, ring, ring.q_lens, *xs[:3], xs[3:] or None)

    if not graphs_wanted(prepared.graphs, q.device):
        result = run(inputs)
    else:
        result = ring.graphed(ring.graph_key((call.graph_key(),), inputs), inputs, run)
    ring.finished("forward")
    if swapped:
        return result[0].transpose(1, 2), result[1]
    return result


def train_attn(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prepared: PreparedCall
) -> tuple[torch.Tensor, torch.Tensor]:
    """The block-schedule path of a prepared call (`prepared.train`), with autograd:
    `prepared.call` is its BlockCall (schedule, pair, document plan, head start) or KvCall;
    `prepared.graphs`: replay its halves as CUDA graphs (RingConfig.train_cuda_graph)."""
    ring = prepared.ring
    return TokenRingAttention.apply(q, k, v, prepared.call, ring, ring.q_lens, prepared.graphs)
