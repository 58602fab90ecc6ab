"""fp32 log-sum-exp merge of attention partials for one query block."""

from __future__ import annotations

import torch

from . import fused as fused_merge
from ..tensor_layout import Layout


class PartialMerge:
    """Accumulates (out, lse) partials of the same queries against disjoint key blocks.

    The math is fp32 (`acc`): new_lse = logaddexp(lse, block_lse) and each side weighs
    exp(its_lse - new_lse) (= sigmoid(block_lse - lse) for the block: the stable form of
    zhuzilin/ring-flash-attention#34). Storage follows the work left: with more than one merge to
    come the running out is an fp32 accumulator; the last merge of each query (`last=True`)
    writes the caller's dtype directly, so a 2-rank ring never materialises fp32 at all.
    In a captured CUDA graph (or with `eager_fused`) each merge is one Triton pass (fused_merge;
    `fused=False` turns it off); elsewhere a few torch ops.
    """

    def __init__(
        self,
        block_out: torch.Tensor,
        block_lse: torch.Tensor,
        layout: Layout,
        out_dtype: torch.dtype | None = None,
        updates: int | None = None,
        fused: bool = True,
        eager_fused: bool = False,
        into: tuple[torch.Tensor, torch.Tensor] | None = None,
        owned: bool = False,
        in_place: bool = False,
        acc: torch.dtype = torch.float32,
    ):
        """`into`: (out, lse) views the result is written to (rows of a larger output).
        `owned`: block_out/block_lse are fresh buffers the merge may keep (no copy: fp32, or
        the caller's dtype with one update); they may hold empty rows (lse -inf) that two empty
        partials must leave empty, not NaN. `in_place` (one update): the last merges write into
        block_out itself, so rows that no partial reaches keep their start. `acc`: what the
        math and the running out use (fp64: a ring measuring its kernels' own error; torch ops)."""
        self.layout, self.acc = layout, acc
        self.dtype = out_dtype or block_out.dtype
        self._empty_rows = owned
        self._in_place = in_place
        many = updates is None or updates > 1
        self.out = block_out if owned or not many else block_out.to(acc, copy=True)
        if into is None:
            self.lse = block_lse if owned else block_lse.to(torch.float32, copy=True)
            self.final: torch.Tensor | None = None
        else:
            self.final, self.lse = into
            self.lse.copy_(block_lse)
        # The Triton pass only while a CUDA graph is being captured: its Python launcher costs
        # more host time per call than the torch ops, which only a graph replay hides. Unless
        # `eager_fused` (the training loops' large blocks, where device time dominates: one
        # pass instead of five kernels and two fp32 temporaries per merge).
        self._fused = (
            fused
            and acc == torch.float32
            and block_out.is_cuda
            and (eager_fused or torch.cuda.is_current_stream_capturing())
            and fused_merge.serves(block_out)
        )

    def update(
        self,
        block_out: torch.Tensor,
        block_lse: torch.Tensor,
        seq: slice | None = None,
        last: bool = False,
    ) -> None:
        """Merge one partial; `seq` selects the query positions it covers (a final piece);
        `last` marks the last merge for those positions (writes the final dtype)."""
        out, lse = self.out, self.lse
        if seq is not None:
            out, lse = self.layout.seq_slice(out, seq), lse[:, :, seq]
        if last and self._in_place:
            dst = out
        elif last:
            if self.final is None:
                self.final = torch.empty_like(self.out, dtype=self.dtype)
            dst = self.final if seq is None else self.layout.seq_slice(self.final, seq)
        else:
            if self.out.dtype != self.acc:
                raise RuntimeError("PartialMerge: more merges than announced by `updates`")
            dst = out
        self._merge(dst, lse, out, lse, block_out, block_lse)

    def update_heads(self, block_out: torch.Tensor, block_lse: torch.Tensor, heads: slice) -> None:
        """Merge a partial of the heads `heads` only, every position (not a last merge)."""
        out, lse = self.layout.head_slice(self.out, heads), self.lse[:, heads]
        self._merge(out, lse, out, lse, block_out, block_lse)

    def _merge(self, dst, dst_lse, a, lse_a, b, lse_b) -> None:
        if self._fused:  # (two empty rows stay empty there too)
            to = self.layout.to_bhsd
            fused_merge.merge2_bhsd(to(dst), dst_lse, to(a), lse_a, to(b), lse_b)
            return
        lse_merge(dst, dst_lse, a, lse_a, b, lse_b, self.layout.lse_to_out, self._empty_rows,
                  self.acc)  # fmt: skip

    def result(self, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(out in `dtype` (default: the announced one), lse fp32 (b, h, s))."""
        dtype = dtype or self.dtype
        out = self.final if self.final is not None else self.out
        return out.to(dtype), self.lse


class SplitMerge:
    """The merges of our own queries when their own block runs in two parts (`defer_own`):
    rows [0, a) start from the step-0 block, rows [a, L) from whatever reaches them first (the
    first returned partial, or at ring 2 the held-back block itself). Partials of all rows are
    split at a; both parts write one (out, lse) pair, so no copy joins them."""

    def __init__(
        self,
        head_out: torch.Tensor,
        head_lse: torch.Tensor,
        length: int,
        layout: Layout,
        out_dtype: torch.dtype,
        updates: int,
        fused: bool,
    ):
        b, a, h, dv = layout.dims(head_out)
        self.layout, self.split, self.length = layout, a, length
        self.out = torch.empty(
            (b, length, h, dv) if layout.seq_dim == 1 else (b, h, length, dv),
            dtype=out_dtype, device=head_out.device,
        )  # fmt: skip
        self.lse = torch.empty(b, h, length, dtype=torch.float32, device=head_out.device)
        self._args = dict(out_dtype=out_dtype, updates=updates, fused=fused)
        self.head = PartialMerge(head_out, head_lse, layout, into=self._rows(0, a), **self._args)
        self.tail: PartialMerge | None = None

    def _rows(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        seq = slice(start, stop)
        return self.layout.seq_slice(self.out, seq), self.lse[:, :, seq]

    def _start_tail(self, out: torch.Tensor, lse: torch.Tensor) -> None:
        rows = self._rows(self.split, self.length)
        self.tail = PartialMerge(out, lse, self.layout, into=rows, **self._args)

    def update(self, out, lse, seq: slice | None = None, last: bool = False) -> None:
        """Merge a partial of our rows `seq` (default: all), split between the two parts."""
        s0, s1 = (0, self.length) if seq is None else (seq.start, seq.stop)
        a, sl = self.split, self.layout.seq_slice
        if s0 < a:
            cut = slice(0, min(s1, a) - s0)
            self.head.update(sl(out, cut), lse[:, :, cut], slice(s0, min(s1, a)), last)
        if s1 > a:
            cut = slice(max(s0, a) - s0, s1 - s0)
            part_out, part_lse = sl(out, cut), lse[:, :, cut]
            if self.tail is None:  # only a partial of every row can start the tail
                assert seq is None or (s0 <= a and s1 == self.length)
                self._start_tail(part_out, part_lse)
            else:
                self.tail.update(part_out, part_lse, slice(max(s0, a) - a, s1 - a), last)

    def add_tail(self, out: torch.Tensor, lse: torch.Tensor) -> None:
        """The held-back own block (rows [a, L)); merge order does not change the result, so
        it goes in before the last return, whose merge writes the final rows."""
        if self.tail is None:
            self._start_tail(out, lse)
        else:
            self.tail.update(out, lse)

    def result(self, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.out.to(dtype or self.out.dtype), self.lse


def lse_merge(
    dst: torch.Tensor,
    dst_lse: torch.Tensor,
    a: torch.Tensor,
    lse_a: torch.Tensor,
    b: torch.Tensor,
    lse_b: torch.Tensor,
    lse_as_out,
    empty_rows: bool = False,
    acc: torch.dtype = torch.float32,
) -> None:
    """(dst, dst_lse) = the log-sum-exp merge of partials (a, lse_a) and (b, lse_b), in torch
    ops computing in `acc` (dst may be a). `lse_as_out` views an lse so it broadcasts against
    out; `empty_rows`: rows where both lse are -inf stay empty instead of NaN."""
    new_lse = torch.logaddexp(lse_a, lse_b)
    top = new_lse
    if empty_rows:  # exp(-inf - -inf) would be NaN: weigh against 0 there
        top = torch.where(torch.isneginf(new_lse), torch.zeros_like(new_lse), new_lse)
    weight_a = lse_as_out(torch.exp(lse_a - top))
    weight_b = lse_as_out(torch.exp(lse_b - top))
    dst.copy_(a.to(acc) * weight_a + b.to(acc) * weight_b)
    dst_lse.copy_(new_lse)
