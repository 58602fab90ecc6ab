"""The K/V family's call and its halves: what a half of K/V is, as tensors.

`KvCall` fixes one call of the K/V family (schedules/kv_both_ways.py), the same on every ring
rank. A half is either K/V heads [0, Hkv/2) or [Hkv/2, Hkv), serving query heads [0, H/2) or
[H/2, H) (query head i uses K/V head i // g), or a set of token ranges with every head
(`half_ranges`). A travelling half is a dense (K, V) pair (P2P needs dense buffers); its FRONT
is its part in the owner's chunk j (causal blocks, the schedule's Note). Packed documents or a
sliding window: the call's `plan` gives every block's mask and the rows with the transfers they
need (ring/packed/kv_plan.py).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..kernels import KernelPair
from ..schedules.blocks import FRONT, part_slice
from ..schedules.kv_both_ways import KvStep, front_len, half_ranges, kv_steps
from ..tensor_layout import Layout

if TYPE_CHECKING:
    from ..packed.kv_plan import KvPlan

__all__ = ["KvCall", "TravellingKv", "acc_dtype"]


def acc_dtype(dtype: torch.dtype, acc: torch.dtype = torch.float32) -> torch.dtype:
    """Sums in `acc` at least (fp32 by default; fp64 stays fp64)."""
    return torch.promote_types(dtype, acc)


@dataclass(frozen=True)
class KvCall:
    """What one call of the K/V family fixes; the same on every ring rank."""

    pair: KernelPair
    layout: Layout
    scale: float
    causal: bool
    by_heads: bool  # halves by K/V heads (schedules.kv_both_ways.split_by_heads), else tokens
    # what partials and gradients are summed (and multi-hop sums travel) in: fp32; fp64 sums
    # measure what the block kernels' own rounding alone makes of a ring (the GPU tests)
    acc: torch.dtype = torch.float32
    plan: KvPlan | None = None  # packed documents, a window: every block's mask (packed/kv_plan.py)

    @property
    def packing(self) -> Hashable:
        """A packed call's agreed layout and documents (None: not packed), as BlockCall's."""
        return None if self.plan is None else self.plan.packing

    def graph_key(self) -> tuple:
        """What a captured graph of this call bakes in besides the ring's agreed value and the
        tensors' signature (training/run.py)."""
        return ("kv", self.pair, self.layout.name, self.scale, self.causal, self.by_heads,
                self.acc, self.plan)  # fmt: skip

    def mask(self, rank: int, step: int, half: int):
        """The kernel's mask argument for `rank`'s block of `half` at `step` (0: the diagonal):
        the causal flag (only the diagonal is masked), or the plan's (segments; () : the block
        is not run)."""
        if self.plan is None:
            return self.causal and step == 0
        return self.plan.block(rank, step, half)

    def steps(self, rank: int, size: int) -> tuple[KvStep, ...]:
        """`rank`'s rows: the table's, or the plan's (only the transfers its blocks need)."""
        if self.plan is None:
            return kv_steps(rank, size, self.causal)
        return self.plan.steps(rank)

    def heads(self, x: torch.Tensor, half: int) -> torch.Tensor:
        """x's heads that go with a half (all of them for token halves): q, out, dO or K/V."""
        if not self.by_heads:
            return x
        h = x.shape[self.layout.head_dim] // 2
        return self.layout.head_slice(x, slice(0, h) if half == 0 else slice(h, 2 * h))

    def rows(self, x: torch.Tensor, part: str) -> torch.Tensor:
        """A part (ALL / BACK) of our own queries' rows of x (layout dims)."""
        return self.layout.seq_slice(x, part_slice(part, x.shape[self.layout.seq_dim]))

    def stat(self, x: torch.Tensor, half: int, part: str) -> torch.Tensor:
        """A view of a (b, h, s) row statistic (lse, delta) for a half's heads and a part."""
        if self.by_heads:
            h = x.shape[1] // 2
            x = x[:, :h] if half == 0 else x[:, h:]
        return x[:, :, part_slice(part, x.shape[2])]

    def cut(self, x: torch.Tensor, half: int) -> torch.Tensor:
        """Our own K or V's half, dense (what travels)."""
        ranges = half_ranges(x.shape[self.layout.seq_dim], self.causal, self.by_heads)[half]
        pieces = [self.layout.seq_slice(self.heads(x, half), slice(*r)) for r in ranges]
        if len(pieces) == 1:
            return pieces[0].contiguous()
        return torch.cat(pieces, self.layout.seq_dim)

    def empty(self, like: torch.Tensor, half: int, length: int, dtype=None) -> torch.Tensor:
        """A receive buffer for a half of K or V (shaped like `like`: our own K or V) whose owner
        holds `length` tokens."""
        b, _, h, d = self.layout.dims(like)
        ranges = half_ranges(length, self.causal, self.by_heads)[half]
        tokens = sum(stop - start for start, stop in ranges)
        heads = h // 2 if self.by_heads else h
        shape = (b, tokens, heads, d) if self.layout.seq_dim == 1 else (b, heads, tokens, d)
        return torch.empty(shape, dtype=dtype or like.dtype, device=like.device)

    def kv_rows(self, x: torch.Tensor, half: int, part: str, length: int) -> torch.Tensor:
        """The `part` (ALL / FRONT) of a held half of an owner with `length` tokens."""
        if part != FRONT:
            return x
        front = front_len(length, half, self.causal, self.by_heads)
        return self.layout.seq_slice(x, slice(0, front))

    def add_home(self, full: torch.Tensor, got: torch.Tensor, half: int) -> None:
        """Add a half's dK or dV (`got`, as it travelled) into our own full sum."""
        seq, mine = self.layout.seq_slice, self.heads(full, half)
        ranges = half_ranges(full.shape[self.layout.seq_dim], self.causal, self.by_heads)[half]
        at = 0
        for start, stop in ranges:
            seq(mine, slice(start, stop)).add_(seq(got, slice(at, at + stop - start)))
            at += stop - start


class TravellingKv:
    """What both passes' payloads send of this rank's K/V: its halves, and buffers for a half
    arriving from `length` tokens (the payload sets `call`, `k` and `v`)."""

    call: KvCall
    k: torch.Tensor
    v: torch.Tensor

    def own(self, half: int) -> list[torch.Tensor]:
        return [self.call.cut(self.k, half), self.call.cut(self.v, half)]

    def kv_buffers(self, half: int, length: int) -> list[torch.Tensor]:
        return [self.call.empty(x, half, length) for x in (self.k, self.v)]
