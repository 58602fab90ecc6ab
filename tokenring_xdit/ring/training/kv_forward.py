"""The K/V family's forward: our queries meet every rank's K/V halves as they pass by.

Step 0 runs our own queries against our own K/V (the causal diagonal where causal); each later
step runs them against the two halves held (schedules/kv_both_ways.py), and every partial is
merged at once into our running (out, lse) in fp32 by log-sum-exp (the fused Triton pass on CUDA
where it serves, else torch ops). Nothing goes home: Q, out and lse never move. Packed documents,
a window: each kernel takes its block's mask (the plan's), and a block with nothing visible
adds nothing (not run).
"""

from __future__ import annotations

import torch

from ..agreed_ring import Ring
from ..comm import COUNTERS
from ..merge import fused as fused_merge
from ..merge.partials import lse_merge
from ..schedules.kv_both_ways import A, B, KvStep
from .kv_halves import KvCall, TravellingKv, acc_dtype
from .kv_loop import run_kv

__all__ = ["kv_forward"]


def kv_forward(
    call: KvCall, ring: Ring, kv_lens: tuple[int, ...], q, k, v
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out in q's dtype, lse (b, h, s) fp32) of our queries against every rank's K/V.
    kv_lens: every ring rank's local K/V length."""
    COUNTERS.kernel_calls += 1
    out, lse = call.pair.run_forward(q, k, v, call.scale, call.layout, call.mask(ring.rank, 0, A))
    if ring.size == 1:
        return out.to(q.dtype), lse.float()
    pay = _Forward(call, ring.rank, kv_lens, q, k, v, out, lse)
    return run_kv(call.steps(ring.rank, ring.size), ring, kv_lens, pay)


class _Forward(TravellingKv):
    """The forward's payload (kv_loop.KvPayload): K/V halves travel, partials merge here."""

    grads = False

    def __init__(self, call: KvCall, rank: int, kv_lens, q, k, v, out, lse):
        self.call, self.rank, self.kv_lens, self.q, self.k, self.v = call, rank, kv_lens, q, k, v
        self.out = out.to(acc_dtype(q.dtype, call.acc), copy=True)  # step 0's block starts the sums
        self.lse = lse.float().clone()
        self.fused = fused_merge.serves(self.out)

    def step(self, st: KvStep, held) -> None:
        if st.diagonal:
            return  # ran before the loop: it started the sums
        call = self.call
        for half in (A, B):
            row, mask = st.halves[half], call.mask(self.rank, st.step, half)
            if mask == ():
                continue  # no pair visible here (other documents, outside the window)
            q = call.rows(call.heads(self.q, half), row.q_part)
            length = self.kv_lens[row.owner]
            kv = [call.kv_rows(x, half, row.kv_part, length) for x in held[half]]
            COUNTERS.kernel_calls += 1
            o, lse = call.pair.run_forward(q, *kv, call.scale, call.layout, mask)
            dst = call.rows(call.heads(self.out, half), row.q_part)
            self._merge(dst, call.stat(self.lse, half, row.q_part), o, lse.float())

    def _merge(self, dst, dst_lse, o, lse) -> None:
        if self.fused:
            to = self.call.layout.to_bhsd
            fused_merge.merge2_bhsd(to(dst), dst_lse, to(dst), dst_lse, to(o), lse)
        else:
            # (empty_rows: a rank without keys leaves its rows at lse -inf until a partial comes)
            lse_merge(dst, dst_lse, dst, dst_lse, o, lse, self.call.layout.lse_to_out, True,
                      self.out.dtype)  # fmt: skip

    def settle(self, st, arrived, home) -> None:
        pass

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.out.to(self.q.dtype), self.lse
