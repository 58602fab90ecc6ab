"""fp32 log-sum-exp merge of attention partials for one query block."""

from __future__ import annotations

import torch

from .layout import Layout


class PartialMerge:
    """Accumulates (out, lse) partials of the same queries against disjoint key blocks.

    out is kept in fp32 in the caller's layout, lse as (b, h, s) fp32. With
    new_lse = logaddexp(lse, block_lse) the block's weight is exp(block_lse - new_lse), which
    equals sigmoid(block_lse - lse): the numerically stable form of
        out <- out - sigmoid(block_lse - lse) * (out - block_out)
        lse <- lse - logsigmoid(lse - block_lse)
    (ring-flash-attention PR #34 derives it). Both updates are in place.
    """

    def __init__(self, block_out: torch.Tensor, block_lse: torch.Tensor, layout: Layout):
        self.layout = layout
        self.out = block_out.to(torch.float32, copy=True)
        self.lse = block_lse.to(torch.float32, copy=True)

    def update(
        self, block_out: torch.Tensor, block_lse: torch.Tensor, seq: slice | None = None
    ) -> None:
        """Merge one partial; `seq` selects the query positions it covers (a final chunk)."""
        out, lse = self.out, self.lse
        if seq is not None:
            out = self.layout.seq_slice(out, seq)
            lse = lse[:, :, seq]
        new_lse = torch.logaddexp(lse, block_lse)
        weight = torch.exp(block_lse - new_lse)
        out.lerp_(block_out.to(torch.float32), self.layout.lse_to_out(weight))
        lse.copy_(new_lse)

    def result(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(out in `dtype`, lse fp32 (b, h, s))."""
        return self.out.to(dtype), self.lse
