"""The forward of training (and of causal zigzag calls): the block loop with forward payloads.

What travels is the held query part; what comes home is its (out, lse) partial, merged in fp32
(`BlockCall.acc`) into our own (`merge.PartialMerge`). The loop itself (lanes, steps, document
skips, the head start) is `block_loop.py`. The no-grad non-causal path keeps using
`forward.py` (CUDA graphs, the chunked last return, the held-back own block, the fused merge).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .block_loop import BlockCall, run_blocks
from ..comm import COUNTERS
from .hold_back import Piece, Pieces
from .kv_halves import acc_dtype
from ..kernels import empty_partial
from ..merge.partials import PartialMerge
from ..agreed_ring import Ring
from ..schedules.blocks import BlockStep, Part

__all__ = ["BlockCall", "block_forward"]


def block_forward(
    call: BlockCall, ring: Ring, q_lens: tuple[int, ...], q, k, v
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out in q's dtype, lse (b, h, s) fp32) of our queries against every rank's K/V.

    Of `ring` the loop uses rank, size and lanes() only (benchmarks/replay_rank.py and
    tests/thread_ring.py pass rings whose lanes are local)."""
    if ring.size > 1:
        return run_blocks(call, ring, q_lens, k, _Forward(call, q, k, v, ring.size))
    mask = call.mask(ring.rank, call.schedule.block_steps(ring.rank, 1)[0])
    if mask == ():
        return empty_partial(q, v, call.layout)
    COUNTERS.kernel_calls += 1
    out, lse = call.pair.run_forward(q, k, v, call.scale, call.layout, mask)
    return out.to(q.dtype), lse.float()


@dataclass
class _Forward:
    """The forward's payload (block_loop.Payload): Q travels, (out, lse) comes home."""

    call: BlockCall
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    n: int  # ring size: at 2, each row merges at most one partial (its start aside)
    merge: PartialMerge | None = None
    split: Pieces | None = field(init=False)  # the own block held back in part (diagonal.py)

    def __post_init__(self) -> None:
        self.split = self.call.own_pieces(self.q, self.k)

    def travelling(self) -> list[torch.Tensor]:
        return [self.q.contiguous()]

    def part(self, held, held_part: Part, wanted: Part, length: int) -> list[torch.Tensor]:
        return [self.call.seq(held[0], held_part, wanted, length).contiguous()]

    def travel_buffers(self, length: int) -> list[torch.Tensor]:
        b, _, h, d = self.call.layout.dims(self.q)
        return [self.call.layout.empty(b, length, h, d, like=self.q)]

    def home_buffers(self, length: int) -> list[torch.Tensor]:
        b, _, h, _ = self.call.layout.dims(self.q)
        return [
            self.call.layout.empty(b, length, h, self.v.shape[3], like=self.q),
            torch.empty(b, h, length, dtype=torch.float32, device=self.q.device),
        ]

    def _piece(self, p: Piece) -> tuple[torch.Tensor, torch.Tensor]:
        """(out, lse) of the own block on one piece's heads."""
        call, heads = self.call, self.call.layout.head_slice
        qkv = (heads(self.q, p.q), heads(self.k, p.kv), heads(self.v, p.kv))
        return call.pair.run_forward(*qkv, call.scale, call.layout, call.schedule.causal)

    def block(self, st: BlockStep, held, mask) -> list[torch.Tensor]:
        call = self.call
        if st.step == 0 and self.split is not None:  # the head piece; the tail runs last
            return list(self._piece(self.split.head))
        kv = call.kv(self.k, self.v, st)
        out_b, lse_b = call.pair.run_forward(held[0], *kv, call.scale, call.layout, mask)
        return [out_b.contiguous(), lse_b.float().contiguous()]  # P2P needs dense buffers

    def start(self, block) -> None:
        # step 0: our own Q against our own K/V. From ring 3 the accumulator stays fp32
        # throughout: a causal rank merges partials of different parts, so no merge is "last"
        # for all rows. At ring 2 a row merges at most the one return, so that merge is its last
        # and writes q's dtype in place (rows it does not cover keep their start): the result
        # is the same (the start's values are exact in fp32 too; one rounding at the end),
        # without the fp32 copy and its conversion back.
        layout, once = self.call.layout, self.n == 2
        acc = acc_dtype(self.q.dtype, self.call.acc)
        args = dict(updates=1 if once else None, eager_fused=True, in_place=once, acc=acc)
        if self.split is not None:  # the head piece's heads; the tail's start empty
            if once:  # (at ring 2 the tail writes its heads before the return comes)
                b, length, h, _ = layout.dims(self.q)
                out = layout.empty(b, length, h, self.v.shape[3], like=self.q)
                lse = torch.empty(b, h, length, dtype=torch.float32, device=self.q.device)
            else:
                out, lse = empty_partial(self.q, self.v, layout, acc)
            layout.head_slice(out, self.split.head.q).copy_(block[0])
            lse[:, self.split.head.q].copy_(block[1])
            self.merge = PartialMerge(out, lse, layout, self.q.dtype, owned=True, **args)
            return
        block = block if block is not None else empty_partial(self.q, self.v, layout)
        self.merge = PartialMerge(*block, layout, self.q.dtype, **args)

    def tail(self, pause) -> int:
        if self.split is None:
            return 0
        heads, p = self.call.layout.head_slice, self.split.tail
        pause(heads(self.q, p.q), heads(self.k, p.kv))
        out, lse = self._piece(p)
        if self.n == 2:  # the return comes after: the tail starts its heads
            heads(self.merge.out, p.q).copy_(out)
            self.merge.lse[:, p.q].copy_(lse)
        else:
            self.merge.update_heads(out, lse, heads=p.q)
        return 1

    def add(self, ret, seq: slice) -> None:
        self.merge.update(*ret, seq=seq, last=self.n == 2)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.merge.result(self.q.dtype)
