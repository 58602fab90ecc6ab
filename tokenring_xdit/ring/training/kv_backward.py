"""The K/V family's backward: the forward's table again, with each half's dK/dV following it.

We have our own O, so every block's kernel reads the real O and the final lse (and delta =
rowsum(dO * O), computed once): no stand-in, nothing about our queries travels, and dQ is summed
here (fp32). The K/V halves travel as in the forward; the dK/dV of a half are accumulated on
their way: the half's first holder starts the sum from its block, each later holder adds its
block to the sum that arrives from the previous one and posts it on one step late, and the last
holder's sum reaches the owner on the table's last row, where it joins the owner's own dK/dV
(schedules/kv_both_ways.py). A sum that makes more than one hop travels in fp32 (N >= 3): it is
rounded once, at home, like every other sum here; at N = 2 it is one block, sent in K's dtype.
Packed documents, a window: kernels take their block's mask (the plan's); a block with nothing
visible is not run, and no sum passes it: a half's sum runs along each run of holders with a
block and goes home from the run's last holder (straight to its owner where that is not the
neighbour; `kv_both_ways.kept_steps`).
"""

from __future__ import annotations

import torch

from ..agreed_ring import Ring
from ..comm import COUNTERS
from ..kernels import row_delta
from ..schedules.blocks import ALL
from ..schedules.kv_both_ways import A, B, KvStep
from .kv_halves import KvCall, TravellingKv, acc_dtype
from .kv_loop import run_kv

__all__ = ["kv_backward"]


def kv_backward(
    call: KvCall, ring: Ring, kv_lens: tuple[int, ...], dout, q, k, v, out, lse
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of this rank's q, k, v, in their dtypes. out/lse: the forward's result."""
    dout = dout.contiguous()
    COUNTERS.kernel_calls += 1
    args = (call.scale, call.layout, call.mask(ring.rank, 0, A))
    if ring.size == 1:  # the kernel reads O itself
        return call.pair.run_backward(dout, q, k, v, out, lse, None, *args)
    delta = row_delta(dout, out, call.layout)
    own = call.pair.run_backward(dout, q, k, v, out, lse, delta, *args)
    pay = _Backward(call, ring.rank, kv_lens, ring.size, (dout, q, k, v, out, lse, delta), own)
    return run_kv(call.steps(ring.rank, ring.size), ring, kv_lens, pay)


class _Backward(TravellingKv):
    """The backward's payload (kv_loop.KvPayload): K/V halves and their dK/dV sums travel, dQ
    is summed here."""

    grads = True

    def __init__(self, call: KvCall, rank: int, kv_lens, n: int, inputs, own):
        self.call, self.rank, self.kv_lens = call, rank, kv_lens
        self.dout, self.q, self.k, self.v, self.out, self.lse, self.delta = inputs
        acc = acc_dtype(self.q.dtype, call.acc)
        self.dq, self.dk, self.dv = (g.to(acc, copy=True) for g in own)  # step 0 starts them
        self.travel = self.k.dtype if n == 2 else acc_dtype(self.k.dtype, call.acc)
        self.made: list = [None, None]  # per half: this row's block (dk, dv) and its row
        self.sums: list = [[], []]  # per half: the sum made at the previous row, posted now

    def grad_buffers(self, half: int, length: int) -> list[torch.Tensor]:
        return [self.call.empty(x, half, length, self.travel) for x in (self.k, self.v)]

    def outgoing(self, half: int) -> list[torch.Tensor]:
        return self.sums[half]

    def step(self, st: KvStep, held) -> None:
        if st.diagonal:
            return  # ran before the loop: it started the sums
        call = self.call
        for half in (A, B):
            row, mask = st.halves[half], call.mask(self.rank, st.step, half)
            if mask == ():  # nothing visible: no dQ, no dK/dV (no sum passes here)
                self.made[half] = None
                continue
            q_rows = [call.rows(call.heads(x, half), row.q_part) for x in
                      (self.dout, self.q, self.out)]  # fmt: skip
            stats = [call.stat(x, half, row.q_part).contiguous() for x in (self.lse, self.delta)]
            kv = [call.kv_rows(x, half, row.kv_part, self.kv_lens[row.owner]) for x in held[half]]
            COUNTERS.kernel_calls += 1
            dq, dk, dv = call.pair.run_backward(
                q_rows[0], q_rows[1], *kv, q_rows[2], *stats, call.scale, call.layout, mask
            )
            call.rows(call.heads(self.dq, half), row.q_part).add_(dq)
            self.made[half] = (dk, dv, row)

    def settle(self, st: KvStep, arrived, home) -> None:
        for half in (A, B):
            came = arrived[half] if not st.kernel else home[half]  # our own half's sum
            for full, got in zip((self.dk, self.dv), came or (), strict=False):
                self.call.add_home(full, got, half)
            if st.kernel and not st.diagonal:
                self.sums[half] = self._summed(half, arrived[half])

    def _summed(self, half: int, arrived) -> list[torch.Tensor]:
        """This row's block added to the half's sum that arrived (a run's first holder starts
        it); nothing where the block was not run."""
        if self.made[half] is None:
            return []
        dk, dv, row = self.made[half]
        length = self.kv_lens[row.owner]
        if arrived is None:  # dense buffers: the kernel's grads may be views (P2P needs dense)
            arrived = self.grad_buffers(half, length)
            if row.kv_part == ALL:
                return [total.copy_(g) for total, g in zip(arrived, (dk, dv), strict=True)]
            arrived = [total.zero_() for total in arrived]
        for total, g in zip(arrived, (dk, dv), strict=True):
            self.call.kv_rows(total, half, row.kv_part, length).add_(g)
        return arrived

    def result(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.dq.to(self.q.dtype), self.dk.to(self.k.dtype), self.dv.to(self.v.dtype)
