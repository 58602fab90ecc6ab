"""The K/V family's loop: one skeleton for its forward and its backward.

Each row of the table (schedules/kv_both_ways.py) posts both lanes before the row's kernels and
waits for them after: the forward lane moves the A halves to r+1, the backward lane the B halves
to r-1 (on NCCL two communicators, so both directions run at once); in the backward each lane
also carries its halves' dK/dV accumulators one step behind them. What the kernels compute and
how results are summed is the pass's `KvPayload` (kv_forward.py, kv_backward.py). A call with a
plan (packed documents, a window) runs its rows (`KvPlan.steps`): transfers no block needs are
not posted, and a sum may come home early, straight from a run's last holder. Every wait is the
lane's, bounded by the ring's deadline.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ..agreed_ring import Ring
from ..schedules.kv_both_ways import A, B, HalfRow, KvStep

__all__ = ["KvPayload", "run_kv"]

Tensors = list[torch.Tensor]


class KvPayload(Protocol):
    grads: bool  # the backward: accumulators travel too, and the row N brings them home

    def own(self, half: int) -> Tensors:
        """Our own half's (K, V), dense: what we send at step 0."""

    def kv_buffers(self, half: int, length: int) -> Tensors:
        """Receive buffers for a half of (K, V) whose owner holds `length` tokens."""

    def grad_buffers(self, half: int, length: int) -> Tensors:
        """Receive buffers for a half's dK/dV accumulator (owner of `length` tokens)."""

    def outgoing(self, half: int) -> Tensors:
        """The accumulator made at the previous row, to post now."""

    def step(self, st: KvStep, held: list[Tensors]) -> None:
        """Run the row's kernels on the held halves (A, B) and sum what stays here."""

    def settle(self, st: KvStep, arrived: list[Tensors | None], home: list[Tensors | None]):
        """After the waits: take in the accumulators that arrived (per half, or None), passed
        on (row N: home) and home early (`HalfRow.home_from`)."""

    def result(self) -> tuple[torch.Tensor, ...]:
        """The pass's result."""


def run_kv(
    steps: tuple[KvStep, ...], ring: Ring, kv_lens: tuple[int, ...], pay: KvPayload
) -> tuple[torch.Tensor, ...]:
    """Run this rank's rows (`KvCall.steps`) on a ring of N > 1 (of `ring`: rank, size and
    lanes() only, so a test or a replay may pass local lanes). kv_lens: every rank's local K/V
    length. A half not received keeps the one held: no later block of this rank reads it."""
    lanes = ring.lanes()
    held = [pay.own(A), pay.own(B)]
    for st in steps:
        if not st.kernel and not pay.grads:
            break  # the forward ends with its last kernel row
        moved = [_post(lanes[h], st.step, st.halves[h], h, held[h], pay, kv_lens, ring.rank)
                 for h in (A, B)]  # fmt: skip
        if st.kernel:
            pay.step(st, held)
        for lane in lanes:
            lane.wait()
        pay.settle(st, [m[1] for m in moved], [m[2] for m in moved])
        held = [m[0] if m[0] is not None else old for m, old in zip(moved, held, strict=True)]
    return pay.result()


def _post(lane, step: int, row: HalfRow, half: int, held: Tensors, pay: KvPayload, kv_lens,
          rank: int):  # fmt: skip
    """Post one half's row on its lane: its K/V on to the next holder, the next K/V in, and in
    the backward the previous row's accumulator on (or home) and this row's in, and our own
    half's sum home early. Empty tensors (a token half of a very short shard) are not sent:
    both ends know the shapes. (Messages between two ranks on one lane keep this order.)"""
    lane.step = step
    sends, recvs, nxt, arrived, home = [], [], None, None, None
    if row.send_to is not None:
        sends += [(t, row.send_to) for t in held]
    if row.recv_from is not None:
        nxt = pay.kv_buffers(half, kv_lens[row.recv_owner])
        recvs += [(t, row.recv_from) for t in nxt]
    if pay.grads and row.grad_send_to is not None:
        sends += [(t, row.grad_send_to) for t in pay.outgoing(half)]
    if pay.grads and row.grad_recv_from is not None:
        arrived = pay.grad_buffers(half, kv_lens[row.grad_owner])
        recvs += [(t, row.grad_recv_from) for t in arrived]
    if pay.grads and row.home_from is not None:
        home = pay.grad_buffers(half, kv_lens[rank])
        recvs += [(t, row.home_from) for t in home]
    lane.post([s for s in sends if s[0].numel()], [r for r in recvs if r[0].numel()], "kv")
    return nxt, arrived, home
