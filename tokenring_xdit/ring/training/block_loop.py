"""The TokenRing block loop of training: one skeleton for the forward and the backward.

K/V stay home; what the held query needs travels one hop per step on the Q lane, and each step's
partial goes straight home one step late on the return lane; both lanes are posted before the
step's kernel and waited after it. A step's kernel covers the parts of Q and K/V its `BlockStep`
names (schedules/blocks.py). What travels, what comes home and how it is summed is the pass's
`Payload`: block_forward.py (Q out; (out, lse) home, fp32 LSE merge) and backward.py ((Q, dO,
lse, delta) out; dQ home, summed; dK/dV summed where they are made).

Packed documents (`BlockCall.plan`, a `agreed_ring.BlockPlan`): a step's kernel gets the block's
segments instead of the causal flag; a block without any is skipped, and so are the return of its
partial and the transfers of a query no later holder needs (every rank knows which from the agreed
plan, so both ends of each transfer skip it together).

Held back (`BlockCall.hold_back`, diagonal.py): step 0 runs the own block on its first K/V
heads, the return-only row on the rest, behind the last return; the transfers are the same.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Protocol

import torch

from ..agreed_ring import BlockPlan, Ring
from ..comm import COUNTERS
from ..head_start import head_start
from ..kernels import KernelPair
from ..schedules.blocks import BlockStep, Part, part_len, part_slice, sub_slice
from ..tensor_layout import Layout
from .hold_back import Pieces, pieces

__all__ = ["BlockCall", "Payload", "run_blocks"]

Tensors = list[torch.Tensor]


@dataclass(frozen=True)
class BlockCall:
    """What one training/causal call fixes; the same on every ring rank."""

    schedule: object  # a block schedule: name, causal, block_steps(rank, n)
    pair: KernelPair
    layout: Layout
    scale: float
    plan: BlockPlan | None = None  # packed documents: the per-step segments and skips
    head_start_us: float = 0.0  # pause after a partial's post (ring/head_start.py)
    hold_back: bool = False  # part of the own block runs behind the last return (diagonal.py)
    # what partials and gradients are summed in (at least: fp64 inputs sum in fp64): fp32 from
    # ring 3; fp64 sums measure what the block kernels' own rounding alone makes of a ring (the
    # GPU tests set it, as KvCall.acc)
    acc: torch.dtype = torch.float32

    def own_pieces(self, q: torch.Tensor, k: torch.Tensor) -> Pieces | None:
        """How the own block is split (None: it runs whole at step 0). Local to the rank: the
        own block never travels. Packed documents keep their own per-step segments."""
        if not self.hold_back or self.plan is not None:
            return None
        return pieces(self.layout.dims(q)[2], self.layout.dims(k)[2])

    @property
    def packing(self) -> Hashable:
        """The agreed packed documents this call runs (None: not packed), from which every
        rank's plan, segments and transfer table follow (with the schedule and the ring's
        lengths, which the graph key holds too)."""
        return None if self.plan is None else self.plan.packing

    def graph_key(self) -> tuple | None:
        """Everything a captured graph of this call bakes in besides the ring's agreed value
        and the tensors' signature (the pair by value: a frozen record, equal for equal
        choices; a packed call's documents, `packing`). None: not graphed. A packing is shared
        by every layer of a step, so its graphs replay per layer (the ring keeps those of its
        last few packings only: graphs.PACKINGS_KEPT)."""
        return (self.schedule.name, self.pair, self.layout.name, self.scale,
                self.head_start_us, self.hold_back, self.acc, self.packing)  # fmt: skip

    def steps(self, rank: int, n: int) -> tuple[BlockStep, ...]:
        """This rank's rows: the schedule's, or the packed plan's (which may trim what travels,
        `schedules.blocks.Rows`)."""
        return self.schedule.block_steps(rank, n) if self.plan is None else self.plan.steps[rank]

    def mask(self, rank: int, st: BlockStep):
        """The kernel's mask argument at this step: the causal flag, or the block's segments
        (an empty tuple: nothing to attend, the step is skipped)."""
        return st.causal if self.plan is None else self.plan.block(rank, st.step)

    # Which sides of a scheduled transfer run (always, without documents; the plan's table).
    def sends_q(self, rank: int, st: BlockStep) -> bool:
        return self.plan is None or self.plan.transfers(rank)[st.step][0]

    def receives_q(self, rank: int, st: BlockStep) -> bool:
        return self.plan is None or self.plan.transfers(rank)[st.step][1]

    def receives_return(self, rank: int, st: BlockStep) -> bool:
        return self.plan is None or self.plan.transfers(rank)[st.step][2]

    def seq(self, x: torch.Tensor, held: Part, wanted: Part, length: int) -> torch.Tensor:
        """The `wanted` part of x, which holds the `held` part of a sequence of `length`."""
        return self.layout.seq_slice(x, sub_slice(held, wanted, length))

    def kv_slice(self, k: torch.Tensor, st: BlockStep) -> slice:
        """The positions of the local K/V this step's kernel covers."""
        return part_slice(st.kv_part, k.shape[self.layout.seq_dim])

    def kv(self, k, v, st: BlockStep) -> tuple[torch.Tensor, torch.Tensor]:
        sl = self.kv_slice(k, st)
        return self.layout.seq_slice(k, sl), self.layout.seq_slice(v, sl)


class Payload(Protocol):
    """What one pass moves and sums. Lists of tensors travel in order on one lane; every one is
    dense (P2P needs dense buffers). `length`: queries of the part concerned."""

    def travelling(self) -> Tensors:
        """What our own query block sends out at step 0 (held[0] is the query itself)."""

    def part(self, held: Tensors, held_part: Part, wanted: Part, length: int) -> Tensors:
        """The `wanted` part of a held bundle (which holds `held_part` of `length` queries)."""

    def travel_buffers(self, length: int) -> Tensors:
        """Receive buffers for a travelling bundle of `length` queries."""

    def home_buffers(self, length: int) -> Tensors:
        """Receive buffers for a partial of `length` of our own queries coming home."""

    def block(self, st: BlockStep, held: Tensors, mask) -> Tensors:
        """Run this step's kernel on the held bundle (and sum what stays here); returns the
        partial that goes home (dense from step 1 on)."""

    def tail(self, pause: Callable[[torch.Tensor, torch.Tensor], None]) -> int:
        """Run the held-back pieces of the own block (diagonal.py), `pause(q, k)` before the
        first, and add them to the sums; returns how many kernels ran (0: none held back)."""

    def start(self, block: Tensors | None) -> None:
        """Start the sums from step 0's partial (None: documents left nothing to attend)."""

    def add(self, ret: Tensors, seq: slice) -> None:
        """Add a partial of our queries `seq` that came home."""

    def result(self) -> tuple[torch.Tensor, ...]:
        """The pass's result, in the callers' dtypes."""


def run_blocks(
    call: BlockCall, ring: Ring, q_lens: tuple[int, ...], k: torch.Tensor, payload: Payload
) -> tuple[torch.Tensor, ...]:
    """Run `call.schedule` on this rank of a ring of N > 1 with `payload`; returns its result.
    k: the local K (sizes the head start's pause). Of `ring` the loop uses rank, size and
    lanes() only (benchmarks/replay_rank.py and tests/thread_ring.py pass local lanes)."""
    rank = ring.rank
    q_lane, ret_lane = ring.lanes()
    held = payload.travelling()
    prev = None  # the previous step's partial: it goes home at this step
    for st in call.steps(rank, ring.size):
        q_lane.step = ret_lane.step = st.step  # named in transfer errors
        next_held = ret = None
        if st.q_send_to is not None:
            next_held = _post_q(call, rank, q_lens, st, q_lane, payload, held)
        if st.ret_send_to is not None:
            ret = _post_return(call, rank, q_lens, st, ret_lane, payload, prev)
        block = None
        mask = call.mask(rank, st) if st.kernel else ()
        if mask != ():
            if st.ret_send_to is not None and prev is not None:  # a partial went out just now
                head_start(call.head_start_us, call.layout, held[0], k)
            COUNTERS.kernel_calls += 1
            block = payload.block(st, held, mask)
        elif not st.kernel and call.hold_back:  # the held-back own pieces hide the return
            sent = st.ret_send_to is not None and prev is not None
            COUNTERS.kernel_calls += payload.tail(functools.partial(_pause, call, sent))
        q_lane.wait()
        ret_lane.wait()
        if st.step == 0:
            payload.start(block)
        elif ret is not None:
            payload.add(ret, part_slice(st.ret_recv_part, q_lens[rank]))
        prev = block if st.step > 0 else None
        if st.q_send_to is not None:
            held = next_held  # None once no later step needs a query here (documents)
    return payload.result()


def _pause(call: BlockCall, sent: bool, q: torch.Tensor, k: torch.Tensor) -> None:
    """The head start before a held-back piece q x k: a return just posted gets its SMs first."""
    if sent:
        head_start(call.head_start_us, call.layout, q, k)


def _post_q(call, rank, q_lens, st: BlockStep, lane, payload: Payload, held) -> Tensors | None:
    """Post the Q lane of this step: the part of the held bundle the next holder needs out,
    the next bundle in. Returns its receive buffers (None when nothing arrives)."""
    sends, next_held = [], None
    if call.sends_q(rank, st):
        part = payload.part(held, st.q_part, st.q_send_part, q_lens[st.q_owner])
        sends = [(t, st.q_send_to) for t in part]
    if call.receives_q(rank, st):
        next_held = payload.travel_buffers(part_len(st.q_recv_part, q_lens[st.q_recv_owner]))
    lane.post(sends, [(t, st.q_recv_from) for t in next_held or ()], "q")
    return next_held


def _post_return(call, rank, q_lens, st: BlockStep, lane, payload: Payload, prev):
    """Post the return lane of this step: the previous step's partial home, a partial of our
    own queries in. Returns its receive buffers (None when nothing arrives)."""
    sends = [(t, st.ret_send_to) for t in prev or ()]
    ret = None
    if call.receives_return(rank, st):
        ret = payload.home_buffers(part_len(st.ret_recv_part, q_lens[rank]))
    lane.post(sends, [(t, st.ret_recv_from) for t in ret or ()], "partial")
    return ret
