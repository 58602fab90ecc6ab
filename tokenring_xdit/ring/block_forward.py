"""The TokenRing forward loop over block steps: causal zigzag, and the forward of training.

Same shape as `forward.py` (K/V stay, Q moves one hop per step, each partial goes straight home
one step late; both lanes posted before the kernel, waited after it), but each step's kernel
covers the parts of Q and K/V its `BlockStep` names, and the loop keeps what the backward needs
(the final fp32 lse). The no-grad non-causal path keeps using `forward.py` (CUDA graphs, the
chunked last return, the fused merge).

Packed documents (`BlockCall.docs`, a `documents.DocPlan`): a step's kernel gets the block's
segments instead of the causal flag; a block without any is skipped, and so are the return of
its partial and the transfers of a query no later holder needs (every rank knows which from
the agreed plan, so both ends of each transfer skip it together).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .comm import COUNTERS
from .documents import DocPlan
from .head_start import head_start
from .kernels import KernelPair
from .layout import Layout
from .merge import PartialMerge
from .ring import Ring
from .schedules.blocks import BlockStep, part_len, part_slice, sub_slice

__all__ = ["BlockCall", "block_forward"]


@dataclass(frozen=True)
class BlockCall:
    """What one training/causal call fixes; the same on every ring rank."""

    schedule: object  # a block schedule: name, causal, block_steps(rank, n)
    pair: KernelPair
    layout: Layout
    scale: float
    docs: DocPlan | None = None  # packed documents: the per-step segments and skips
    head_start_us: float = 0.0  # pause after a partial's post (ring/head_start.py)

    def mask(self, rank: int, st: BlockStep):
        """The kernel's mask argument at this step: the causal flag, or the block's segments
        (an empty tuple: nothing to attend, the step is skipped)."""
        return st.causal if self.docs is None else self.docs.block(rank, st.step)

    def moves(self, what: str, rank: int, st: BlockStep) -> bool:
        """Does this side of a scheduled transfer run? (Always, without documents.)"""
        return self.docs is None or getattr(self.docs, what)(rank, st)

    def seq(self, x: torch.Tensor, held: str, wanted: str, length: int) -> torch.Tensor:
        """The `wanted` part of x, which holds the `held` part of a sequence of `length`."""
        return self.layout.seq_slice(x, sub_slice(held, wanted, length))

    def kv(self, k, v, st: BlockStep) -> tuple[torch.Tensor, torch.Tensor]:
        length = k.shape[self.layout.seq_dim]
        sl = part_slice(st.kv_part, length)
        return self.layout.seq_slice(k, sl), self.layout.seq_slice(v, sl)


def block_forward(
    call: BlockCall, ring: Ring, q_lens: tuple[int, ...], q, k, v
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out in q's dtype, lse (b, h, s) fp32) of our queries against every rank's K/V.

    Of `ring` the loop uses rank, size and lanes() only (benchmarks/replay_rank.py and
    tests/thread_ring.py pass rings whose lanes are local)."""
    layout, rank, n = call.layout, ring.rank, ring.size
    b, _, h, d = layout.dims(q)
    dv = v.shape[3]
    plan = call.schedule.block_steps(rank, n)
    if n == 1:
        mask = call.mask(rank, plan[0])
        if mask == ():
            return _empty_partial(q, v, layout)
        COUNTERS.kernel_calls += 1
        out, lse = call.pair.run_forward(q, k, v, call.scale, layout, mask)
        return out.to(q.dtype), lse.float()
    q_lane, ret_lane = ring.lanes()
    held = q.contiguous()
    merge = prev = None
    for st in plan:
        q_lane.step = ret_lane.step = st.step  # named in transfer errors
        next_q = ret = None
        if st.q_send_to is not None:
            sends = []
            if call.moves("q_send", rank, st):
                own_len = q_lens[st.q_owner]
                send = call.seq(held, st.q_part, st.q_send_part, own_len).contiguous()
                sends = [(send, st.q_send_to)]
            if call.moves("q_recv", rank, st):
                recv_len = part_len(st.q_recv_part, q_lens[st.q_recv_owner])
                next_q = layout.empty(b, recv_len, h, d, like=q)
            q_lane.post(sends, [(next_q, st.q_recv_from)] if next_q is not None else [], "q")
        if st.ret_send_to is not None:
            sends = [] if prev is None else [(prev[0], st.ret_send_to), (prev[1], st.ret_send_to)]
            if call.moves("ret_recv", rank, st):
                ret_len = part_len(st.ret_recv_part, q_lens[rank])
                ret = (
                    layout.empty(b, ret_len, h, dv, like=q),
                    torch.empty(b, h, ret_len, dtype=torch.float32, device=q.device),
                )
            recvs = [] if ret is None else [(x, st.ret_recv_from) for x in ret]
            ret_lane.post(sends, recvs, "partial")
        block = None
        mask = call.mask(rank, st) if st.kernel else ()
        if mask != ():
            if st.ret_send_to is not None and prev is not None:  # a partial went out just now
                head_start(call.head_start_us, layout, held, k)
            COUNTERS.kernel_calls += 1
            out_b, lse_b = call.pair.run_forward(held, *call.kv(k, v, st), call.scale, layout, mask)
            block = (out_b.contiguous(), lse_b.float().contiguous())  # P2P needs dense buffers
        q_lane.wait()
        ret_lane.wait()
        if merge is None:
            # step 0: our own Q against our own K/V. The accumulator stays fp32 throughout: a
            # causal rank merges partials of different parts, so no merge is "last" for all rows.
            block = block if block is not None else _empty_partial(q, v, layout)
            merge = PartialMerge(*block, layout, q.dtype, updates=None, eager_fused=True)
        elif ret is not None:
            merge.update(*ret, seq=part_slice(st.ret_recv_part, q_lens[rank]))
        prev = block if st.step > 0 else None
        if st.q_send_to is not None:
            held = next_q  # None once no later step needs a query here (documents)
    return merge.result(q.dtype)


def _empty_partial(q, v, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """The partial of queries that see no key here: out 0, lse -inf."""
    b, s, h, _ = layout.dims(q)
    out = layout.empty(b, s, h, v.shape[3], like=q).zero_()
    return out, torch.full((b, h, s), float("-inf"), dtype=torch.float32, device=q.device)
