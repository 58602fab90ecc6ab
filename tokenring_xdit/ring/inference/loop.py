"""The TokenRing forward loop: K/V stay, Q moves forward, partials go straight home.

The loop runs a schedule (who sends what to whom at step s, `schedules/`); this file only does
what the table says. Per step both transfers are posted before the kernel and waited after it.
It stays apart from the training loop (block_loop.py) because its last step is not a row of
the table but a chunked return on the idle Q lane with the held-back own block behind it, and
because it is captured in CUDA graphs, where every allocation and merge form is fixed per call.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch

from ..agreed_ring import Ring
from ..comm import COUNTERS, Lane
from ..head_start import head_start
from ..kernels import BlockKernel, run_block
from ..merge.partials import PartialMerge, SplitMerge
from ..schedules import chunk_bounds, held_back
from ..tensor_layout import Layout

__all__ = ["RingCall", "ring_forward", "local_forward", "held_back"]


@dataclass(frozen=True)
class RingCall:
    """What one call fixes before its first step; the same on every ring rank."""

    schedule: object  # a schedules/ object: name, steps(rank, n), final_return(rank, n)
    kernel: BlockKernel
    kernel_key: Hashable | None  # names the kernel stably across calls (None: never graphed)
    layout: Layout
    scale: float
    chunks: int  # pieces of the last partial's return
    joint_strategy: str  # where joint K/V join the local K/V in the step-0 block
    fused_merge: bool
    defer_own: float | None = 0.0  # share of our queries whose own block runs last (None: auto)
    head_start_us: float = 0.0  # pause before a kernel that follows a partial's post (CUDA)

    def graph_key(self) -> tuple:
        """Everything a captured graph bakes in besides the tensors' signature."""
        return (
            self.schedule.name,
            self.kernel_key,
            self.layout.name,
            self.scale,
            self.chunks,
            self.joint_strategy,
            self.fused_merge,
            self.defer_own,
            self.head_start_us,
        )

    def block(self, q, k, v, dense: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(out, lse fp32); `dense` (P2P needs dense buffers) for partials that travel."""
        COUNTERS.kernel_calls += 1
        out, lse = run_block(self.kernel, q, k, v, self.scale, self.layout)
        return (out.contiguous() if dense else out), lse.float().contiguous()

    def join(self, k, v, joint_kv) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of the step-0 block: local plus joint K/V, which only our own queries meet (each
        query's owner runs step 0 on it once, so every query sees the joint K/V once)."""
        if joint_kv is None:
            return k, v
        parts = [(k, v), joint_kv] if self.joint_strategy == "rear" else [joint_kv, (k, v)]
        dim = self.layout.seq_dim
        return tuple(torch.cat([p[i] for p in parts], dim=dim) for i in (0, 1))


def local_forward(call: RingCall, q, k, v, joint_kv) -> tuple[torch.Tensor, torch.Tensor]:
    """Ring of one: no exchange, no self-sends (and no copy to dense P2P buffers)."""
    COUNTERS.kernel_calls += 1
    out, lse = run_block(call.kernel, q, *call.join(k, v, joint_kv), call.scale, call.layout)
    return out.to(q.dtype), lse.float()


def ring_forward(
    call: RingCall, ring: Ring, q_lens: tuple[int, ...], q, k, v, joint_kv
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of our queries against every rank's K/V. q_lens: every rank's query length.

    With `call.defer_own`, the own block of our last `held` queries runs after the last partial
    has been sent, so that partial's return travels behind it instead of in the open (at ring 2
    the Q transfer hides behind the first part, the return behind the second)."""
    layout, rank, n = call.layout, ring.rank, ring.size
    q_lane, out_lane = ring.lanes()
    own_kv = call.join(k, v, joint_kv)
    b, _, h, d = layout.dims(q)
    own_q = held_q = q.contiguous()
    own_len = q_lens[rank]
    held = held_back(own_len, call.defer_own)
    split = own_len - held
    # One receive buffer pair for our own partials, reused: each merge is ordered before the
    # next receive is posted (same stream on CUDA, synchronous on gloo).
    ret_out = layout.empty(b, own_len, h, v.shape[3], like=q)
    ret = ret_out, torch.empty(b, h, own_len, dtype=torch.float32, device=q.device)
    merge = prev = None
    for st in call.schedule.steps(rank, n):
        q_lane.step = out_lane.step = st.step  # named in transfer errors
        next_q = None
        if st.q_send_to is not None:
            next_q = layout.empty(b, q_lens[st.q_recv_owner], h, d, like=q)
            q_lane.post([(held_q, st.q_send_to)], [(next_q, st.q_recv_from)], "q")
        if st.ret_send_to is not None:
            to, frm = st.ret_send_to, st.ret_recv_from
            out_lane.post([(prev[0], to), (prev[1], to)], [(ret[0], frm), (ret[1], frm)], "partial")
        if st.step == n - 1:
            pending = ret if st.ret_send_to is not None else None
            tail = (layout.seq_slice(own_q, slice(split, own_len)), own_kv) if held else None
            final = _Final(call, rank, n, q_lens, q_lane, out_lane)
            return final.run(held_q, k, v, merge, pending, q.dtype, tail)
        if st.ret_send_to is not None:
            head_start(call.head_start_us, layout, held_q, k)
        if st.step == 0 and held:
            block = call.block(layout.seq_slice(held_q, slice(0, split)), *own_kv, dense=False)
        else:
            block = call.block(held_q, *(own_kv if st.step == 0 else (k, v)))
        q_lane.wait()
        out_lane.wait()
        if merge is None:  # step 0: our own Q against our own K/V; n-1 partials of it to come
            merge = _own_merge(call, block, held, own_len, q.dtype, n - 1)
        elif st.ret_send_to is not None:
            merge.update(*ret)
        prev = block if st.step > 0 else None
        held_q = next_q
    raise AssertionError("unreachable: the last step returns")


def _own_merge(call: RingCall, block, held: int, length: int, dtype, updates: int):
    """The merge that starts from the step-0 block (in two parts when its tail is held back)."""
    if held:
        return SplitMerge(*block, length, call.layout, dtype, updates, call.fused_merge)
    return PartialMerge(*block, call.layout, dtype, updates=updates, fused=call.fused_merge)


@dataclass
class _Final:
    """The last step: compute the last partial in pieces and send each home at once.

    It goes home the way Q went (final_return), so it uses the Q lane, idle now; the out lane
    still carries the previous step's return (`pending`), merged while the pieces travel.
    """

    call: RingCall
    rank: int
    size: int
    q_lens: tuple[int, ...]
    q_lane: Lane
    out_lane: Lane

    def run(self, held_q, k, v, merge, pending, dtype, tail=None):
        """`tail`: (held-back own queries, own K/V), run once every piece is on its way."""
        layout = self.call.layout
        send_to, recv_from = self.call.schedule.final_return(self.rank, self.size)
        sent_bounds = chunk_bounds(self.q_lens[send_to], self.call.chunks)  # send_to owns held_q
        recv_bounds = chunk_bounds(self.q_lens[self.rank], self.call.chunks)
        b, _, h, _ = layout.dims(held_q)
        pieces = []
        for (s0, s1), (r0, r1) in zip(sent_bounds, recv_bounds, strict=True):
            out_c, lse_c = self.call.block(layout.seq_slice(held_q, slice(s0, s1)), k, v)
            recv_out = layout.empty(b, r1 - r0, h, v.shape[3], like=held_q)
            recv_lse = torch.empty(b, h, r1 - r0, dtype=torch.float32, device=held_q.device)
            works = self.q_lane.post(
                [(out_c, send_to), (lse_c, send_to)],
                [(recv_out, recv_from), (recv_lse, recv_from)],
                "partial",
            )
            # keep the sent piece referenced until its transfer is waited for
            pieces.append((works, slice(r0, r1), recv_out, recv_lse, out_c, lse_c))
            if s1 < sent_bounds[-1][1] or tail is not None:  # another attention kernel follows
                head_start(self.call.head_start_us, layout, held_q, k)
        if tail is not None:  # the returns travel behind this block
            merge.add_tail(*self.call.block(tail[0], *tail[1], dense=False))
        self.out_lane.wait()
        if pending is not None:
            merge.update(*pending)
        for works, seq, recv_out, recv_lse, *_sent in pieces:  # merge piece c while c+1.. travel
            self.q_lane.wait(works)
            merge.update(recv_out, recv_lse, seq, last=True)
        return merge.result(dtype)
