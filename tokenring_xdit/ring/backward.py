"""The TokenRing backward loop: the forward's block schedule with backward payloads.

K/V stay home and so do their gradients: dK/dV of the local K/V are accumulated here at every
step (fp32 from N = 3 on) and never travel. What travels one hop per step on the Q lane is the
held query part with everything its backward needs: (Q, dO, lse, delta = rowsum(dO * O)); the
kernel pair builds its O stand-in from dO and delta (`standin.py`). The dQ partial of each step
goes straight back to its owner one step late on the return lane, and the owner sums them.
Both lanes are posted before the step's kernel and waited after it. Packed documents skip what
the forward skips (block_forward.py: empty blocks, their dQ returns, queries nobody needs).
"""

from __future__ import annotations

import torch

from .block_forward import BlockCall
from .comm import COUNTERS
from .head_start import head_start
from .kernels import row_delta
from .ring import Ring
from .schedules.blocks import part_len, part_slice

__all__ = ["block_backward"]


def _bundle_buffers(call: BlockCall, like_q, like_do, length: int):
    """Receive buffers for a travelling (Q, dO, lse, delta) bundle of `length` queries."""
    b, _, h, d = call.layout.dims(like_q)
    stats = [torch.empty(b, h, length, dtype=torch.float32, device=like_q.device) for _ in "ld"]
    return [
        call.layout.empty(b, length, h, d, like=like_q),
        call.layout.empty(b, length, h, like_do.shape[3], like=like_do),
        *stats,
    ]


def _bundle_part(call: BlockCall, bundle, held: str, wanted: str, length: int):
    """The `wanted` part of a held bundle, as dense tensors (P2P needs them)."""
    if held == wanted:
        return bundle
    sl = part_slice(wanted, length)
    q, do, lse, delta = bundle
    seq = call.layout.seq_slice
    return [
        seq(q, sl).contiguous(),
        seq(do, sl).contiguous(),
        lse[:, :, sl].contiguous(),
        delta[:, :, sl].contiguous(),
    ]


def block_backward(
    call: BlockCall, ring: Ring, q_lens: tuple[int, ...], dout, q, k, v, out, lse
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of this rank's q, k, v, in their dtypes. out/lse: the forward's result."""
    layout, rank, n = call.layout, ring.rank, ring.size
    plan = call.schedule.block_steps(rank, n)
    dout = dout.contiguous()
    if n == 1:
        # the kernel reads O itself: no delta, no accumulators, no copies (what SDPA does)
        mask = call.mask(rank, plan[0])
        if mask == ():
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        COUNTERS.kernel_calls += 1
        args = (dout, q, k, v, out, lse, None, call.scale, layout, mask)
        return call.pair.run_backward(*args)
    delta = row_delta(dout, out, layout)  # travels instead of O (one fp32 per row)
    q_lane, ret_lane = ring.lanes()
    # Sums start from step 0's block (our own Q against all our K/V: every position). A position
    # gets at most N contributions; with N = 2 the input dtype's own add (fp32 math, one
    # rounding) equals an fp32 sum rounded once, so fp32 accumulators only from N = 3 on.
    acc = torch.float32 if n > 2 else None
    dq = dk = dv = None
    held = [q.contiguous(), dout, lse.contiguous(), delta]
    prev_dq = None
    for st in plan:
        q_lane.step = ret_lane.step = st.step  # named in transfer errors
        next_held = ret = None
        if st.q_send_to is not None:
            sends = []
            if call.moves("q_send", rank, st):
                send = _bundle_part(call, held, st.q_part, st.q_send_part, q_lens[st.q_owner])
                sends = [(t, st.q_send_to) for t in send]
            if call.moves("q_recv", rank, st):
                recv_len = part_len(st.q_recv_part, q_lens[st.q_recv_owner])
                next_held = _bundle_buffers(call, q, dout, recv_len)
            recvs = [(t, st.q_recv_from) for t in next_held] if next_held is not None else []
            q_lane.post(sends, recvs, "q")
        if st.ret_send_to is not None:
            sends = [(prev_dq, st.ret_send_to)] if prev_dq is not None else []
            if call.moves("ret_recv", rank, st):
                ret_len = part_len(st.ret_recv_part, q_lens[rank])
                b, _, h, d = layout.dims(q)
                ret = layout.empty(b, ret_len, h, d, like=q)
            recvs = [(ret, st.ret_recv_from)] if ret is not None else []
            ret_lane.post(sends, recvs, "partial")
        block_dq = None
        mask = call.mask(rank, st) if st.kernel else ()
        if mask != ():
            if st.ret_send_to is not None and prev_dq is not None:  # a dQ went out just now
                head_start(call.head_start_us, layout, held[0], k)
            COUNTERS.kernel_calls += 1
            kv_sl = part_slice(st.kv_part, k.shape[layout.seq_dim])
            k_b, v_b = layout.seq_slice(k, kv_sl), layout.seq_slice(v, kv_sl)
            q_b, do_b, lse_b, delta_b = held
            own_out = out if st.step == 0 else None  # elsewhere the kernel gets delta only
            block_dq, block_dk, block_dv = call.pair.run_backward(
                do_b, q_b, k_b, v_b, own_out, lse_b, delta_b, call.scale, layout, mask
            )
            if st.step == 0:
                dk, dv = _start(block_dk, k, acc), _start(block_dv, v, acc)
            else:
                layout.seq_slice(dk, kv_sl).add_(block_dk)
                layout.seq_slice(dv, kv_sl).add_(block_dv)
        q_lane.wait()
        ret_lane.wait()
        if st.step == 0:
            if block_dq is None:  # documents: nothing of ours to attend here (no tokens)
                dq, dk, dv = (torch.zeros_like(x, dtype=acc or x.dtype) for x in (q, k, v))
            else:
                dq = _start(block_dq, q, acc)
        elif ret is not None:
            layout.seq_slice(dq, part_slice(st.ret_recv_part, q_lens[rank])).add_(ret)
        prev_dq = block_dq.contiguous() if block_dq is not None and st.step > 0 else None
        if st.q_send_to is not None:
            held = next_held  # None once no later step needs a query here (documents)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _start(grad: torch.Tensor, like: torch.Tensor, acc: torch.dtype | None) -> torch.Tensor:
    """The running sum of a gradient, holding step 0's block (the kernel's fresh output, which we
    may add into; a copy when it must become fp32 or is not a dense tensor of like's shape)."""
    dtype = acc or grad.dtype
    if grad.dtype == dtype and grad.shape == like.shape and grad.is_contiguous():
        return grad
    return grad.to(dtype, copy=True)
