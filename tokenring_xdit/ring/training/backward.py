"""The TokenRing backward: the forward's block schedule and loop with backward payloads.

K/V stay home and so do their gradients: dK/dV of the local K/V are accumulated here at every
step (fp32 from N = 3 on) and never travel. What travels one hop per step on the Q lane is the
held query part with everything its backward needs: (Q, dO, lse, delta = rowsum(dO * O)); the
kernel pair builds its O stand-in from dO and delta (`standin.py`). The dQ partial of each step
goes straight back to its owner one step late on the return lane, and the owner sums them.
The loop (lanes, steps, document skips, the head start) is `block_loop.py`.
"""

from __future__ import annotations

import torch

from .block_loop import BlockCall, run_blocks
from ..comm import COUNTERS
from .hold_back import Piece
from .kv_halves import acc_dtype
from ..kernels import row_delta
from ..kernels.standin import out_standin_bhsd
from ..agreed_ring import Ring
from ..schedules.blocks import BlockStep, Part, sub_slice

__all__ = ["block_backward"]


def block_backward(
    call: BlockCall, ring: Ring, q_lens: tuple[int, ...], dout, q, k, v, out, lse
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of this rank's q, k, v, in their dtypes. out/lse: the forward's result."""
    dout = dout.contiguous()
    if ring.size > 1:
        return run_blocks(
            call, ring, q_lens, k, _Backward(call, ring.size, dout, q, k, v, out, lse)
        )
    # the kernel reads O itself: no delta, no accumulators, no copies (what SDPA does)
    mask = call.mask(ring.rank, call.schedule.block_steps(ring.rank, 1)[0])
    if mask == ():
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    COUNTERS.kernel_calls += 1
    args = (dout, q, k, v, out, lse, None, call.scale, call.layout, mask)
    return call.pair.run_backward(*args)


def fold_lse_grad(dout, out, dlse, layout) -> torch.Tensor:
    """O for a backward that also has a gradient of lse (an attention sink applied after the
    ring, a loss on lse): d lse_i / d s_ij = p_ij adds dlse_i * p_ij to dS_ij, the same as
    delta_i - dlse_i in place of delta_i = rowsum(dO_i * O_i); the kernels read O only through
    delta, so its stand-in for that delta (kernels/standin.py) carries it."""
    delta = row_delta(dout, out, layout) - dlse.float()
    return layout.from_bhsd(out_standin_bhsd(layout.to_bhsd(dout), delta))


class _Backward:
    """The backward's payload (block_loop.Payload): (Q, dO, lse, delta) travel, dQ comes home,
    dK/dV are summed where they are made."""

    def __init__(self, call: BlockCall, n: int, dout, q, k, v, out, lse):
        self.call, self.q, self.k, self.v, self.out = call, q, k, v, out
        self.dout, self.lse, self.n = dout, lse, n
        self.delta = row_delta(dout, out, call.layout)  # travels instead of O (fp32 per row)
        # Sums start from step 0's block (our own Q against all our K/V: every position). A
        # position gets at most N contributions; with N = 2 the input dtype's own add (fp32
        # math, one rounding) equals an fp32 sum rounded once, so fp32 sums only from N = 3 on.
        # Held back in part (diagonal.py), the own block is split by heads: no position gets
        # another term, so the same rule holds. `call.acc` other than fp32 (fp64): at any N.
        self.split = call.own_pieces(q, k)
        wide = n > 2 or call.acc != torch.float32
        self.acc = acc_dtype(q.dtype, call.acc) if wide else None
        self.dq = self.dk = self.dv = None

    def travelling(self) -> list[torch.Tensor]:
        return [self.q.contiguous(), self.dout, self.lse.contiguous(), self.delta]

    def part(self, held, held_part: Part, wanted: Part, length: int) -> list[torch.Tensor]:
        if held_part == wanted:
            return held
        sl = sub_slice(held_part, wanted, length)
        q, do, lse, delta = held
        seq = self.call.layout.seq_slice
        return [seq(q, sl).contiguous(), seq(do, sl).contiguous()] + [
            x[:, :, sl].contiguous() for x in (lse, delta)
        ]

    def travel_buffers(self, length: int) -> list[torch.Tensor]:
        layout, q = self.call.layout, self.q
        b, _, h, d = layout.dims(q)
        stats = [torch.empty(b, h, length, dtype=torch.float32, device=q.device) for _ in "ld"]
        do = layout.empty(b, length, h, self.dout.shape[3], like=self.dout)
        return [layout.empty(b, length, h, d, like=q), do, *stats]

    def home_buffers(self, length: int) -> list[torch.Tensor]:
        b, _, h, d = self.call.layout.dims(self.q)
        return [self.call.layout.empty(b, length, h, d, like=self.q)]

    def _piece(self, p: Piece):
        """(dq, dk, dv) of the own block on one piece's heads (the kernel reads O itself)."""
        call, heads = self.call, self.call.layout.head_slice
        qs = [heads(x, p.q) for x in (self.dout, self.q)]
        kv = (heads(self.k, p.kv), heads(self.v, p.kv))
        stats = (self.lse[:, p.q].contiguous(), self.delta[:, p.q].contiguous())
        return call.pair.run_backward(
            *qs, *kv, heads(self.out, p.q), *stats, call.scale, call.layout, call.schedule.causal
        )

    def _start_split(self) -> list[torch.Tensor]:
        """Step 0 held back in part: the head piece's heads of dQ/dK/dV copied into the sums,
        the tail's heads zero until their terms come (adding to zero is exact). At ring 2 no
        dQ partial comes home before the tail runs: the tail's dQ is copied, not added."""
        heads, split = self.call.layout.head_slice, self.split
        self.dq, self.dk, self.dv = (
            torch.empty_like(x, dtype=self.acc or x.dtype) for x in (self.q, self.k, self.v)
        )
        for acc, grad, hs, tail in zip(
            (self.dq, self.dk, self.dv), self._piece(split.head), (split.head.q, split.head.kv,
            split.head.kv), (split.tail.q, split.tail.kv, split.tail.kv), strict=True,
        ):  # fmt: skip
            heads(acc, hs).copy_(grad)
            if acc is not self.dq or self.n > 2:
                heads(acc, tail).zero_()
        return [self.dq]

    def tail(self, pause) -> int:
        if self.split is None:
            return 0
        heads, p = self.call.layout.head_slice, self.split.tail
        pause(heads(self.q, p.q), heads(self.k, p.kv))
        for acc, grad, hs in zip((self.dq, self.dk, self.dv), self._piece(p), (p.q, p.kv, p.kv),
                                 strict=True):  # fmt: skip
            if acc is self.dq and self.n == 2:
                heads(acc, hs).copy_(grad)
            else:
                heads(acc, hs).add_(grad)
        return 1

    def block(self, st: BlockStep, held, mask) -> list[torch.Tensor]:
        call, layout = self.call, self.call.layout
        if st.step == 0 and self.split is not None:
            return self._start_split()
        kv_sl = call.kv_slice(self.k, st)
        q_b, do_b, lse_b, delta_b = held
        own_out = self.out if st.step == 0 else None  # elsewhere the kernel gets delta only
        block_dq, block_dk, block_dv = call.pair.run_backward(
            do_b, q_b, *call.kv(self.k, self.v, st), own_out, lse_b, delta_b, call.scale,
            layout, mask,
        )  # fmt: skip
        if st.step == 0:
            self.dk, self.dv = (
                _start(block_dk, self.k, self.acc),
                _start(block_dv, self.v, self.acc),
            )
            return [block_dq]
        layout.seq_slice(self.dk, kv_sl).add_(block_dk)
        layout.seq_slice(self.dv, kv_sl).add_(block_dv)
        return [block_dq.contiguous()]  # P2P needs a dense buffer

    def start(self, block) -> None:
        if block is None:  # documents: nothing of ours to attend here (no tokens)
            qkv = (self.q, self.k, self.v)
            self.dq, self.dk, self.dv = (
                torch.zeros_like(x, dtype=self.acc or x.dtype) for x in qkv
            )
        elif self.split is None:  # (held back in part: _start_split made the sums)
            self.dq = _start(block[0], self.q, self.acc)

    def add(self, ret, seq: slice) -> None:
        self.call.layout.seq_slice(self.dq, seq).add_(ret[0])

    def result(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.dq.to(self.q.dtype), self.dk.to(self.k.dtype), self.dv.to(self.v.dtype)


def _start(grad: torch.Tensor, like: torch.Tensor, acc: torch.dtype | None) -> torch.Tensor:
    """The running sum of a gradient, holding step 0's block (the kernel's fresh output, which we
    may add into; a copy when it must become fp32 or is not a dense tensor of like's shape)."""
    dtype = acc or grad.dtype
    if grad.dtype == dtype and grad.shape == like.shape and grad.is_contiguous():
        return grad
    return grad.to(dtype, copy=True)
