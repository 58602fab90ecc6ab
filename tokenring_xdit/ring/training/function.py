"""The autograd Function of the block-schedule path (training, causal or packed calls): its
forward and backward halves (run.py) and the ring a pending backward holds. A prepared call
reaches it through seam/run.py's `train_attn`.
"""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist

from ..agreed_ring import Ring
from ..comm.teardown import on_release
from .backward import fold_lse_grad
from .run import TrainCall, train_backward, train_forward

__all__ = ["TokenRingAttention"]


class _Held:
    """The ring a pending backward will use. Released with the ring's communicators
    (teardown.on_release): an output kept past destroy_process_group or to interpreter exit must
    not keep the group, and its gloo threads, alive (they aborted the process at exit).
    `pending`: those not yet run or dropped (weak: bounded by the live outputs)."""

    __slots__ = ("ring", "__weakref__")
    pending: weakref.WeakSet[_Held] = weakref.WeakSet()

    def __init__(self, ring: Ring):
        self.ring: Ring | None = ring
        on_release(_Held.release)  # registered with the first pending backward
        _Held.pending.add(self)

    @staticmethod
    def release(group: dist.ProcessGroup | None) -> None:
        world = dist.group.WORLD if dist.is_initialized() else None
        for held in list(_Held.pending):
            ring = held.ring
            if ring is None:
                continue
            mine = ring.pos.group if ring.pos.group is not None else world
            if group is None or mine is None or mine is group:
                held.ring = None


class TokenRingAttention(torch.autograd.Function):
    """out, lse = TokenRing(q, k, v); saves only this rank's q, k, v, out and lse. `graphs`:
    each half through the ring's CUDA graphs where it can be (train.py; out and lse are then
    clones of the graph's outputs, the caller's own)."""

    @staticmethod
    def forward(ctx, q, k, v, call: TrainCall, ring: Ring, q_lens: tuple[int, ...], graphs=False):
        out, lse = train_forward(call, ring, q_lens, q, k, v, graphs)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.call, ctx.held, ctx.q_lens, ctx.graphs = call, _Held(ring), q_lens, graphs
        ctx.set_materialize_grads(False)  # a gradient of lse is rare: None, not zeros
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        if dlse is not None:  # lse is differentiable (an attention sink, a loss on lse)
            out = fold_lse_grad(dout, out, dlse, ctx.call.layout)
        ring = ctx.held.ring
        if ring is None:
            raise RuntimeError(
                "TokenRing backward: the ring's process group was destroyed (or its "
                "communicators released) after the forward; run backward before "
                "destroy_process_group"
            )
        args = (dout, q, k, v, out, lse, ctx.graphs)
        dq, dk, dv = train_backward(ctx.call, ring, ctx.q_lens, *args)
        return dq, dk, dv, None, None, None, None
