"""Tensor layouts: (b, s, h, d) as flash-attn/yunchang use, (b, h, s, d) as SDPA/xDiT use."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Layout:
    name: str
    seq_dim: int
    head_dim: int

    def dims(self, x: torch.Tensor) -> tuple[int, int, int, int]:
        """(batch, seq, heads, head_size) of a 4-d tensor in this layout."""
        return x.shape[0], x.shape[self.seq_dim], x.shape[self.head_dim], x.shape[3]

    def seq_slice(self, x: torch.Tensor, seq: slice) -> torch.Tensor:
        return x[:, seq] if self.seq_dim == 1 else x[:, :, seq]

    def head_slice(self, x: torch.Tensor, heads: slice) -> torch.Tensor:
        return x[:, heads] if self.head_dim == 1 else x[:, :, heads]

    def to_bhsd(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2) if self.seq_dim == 1 else x

    def from_bhsd(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2) if self.seq_dim == 1 else x

    def lse_to_out(self, lse: torch.Tensor) -> torch.Tensor:
        """View a (b, h, s) per-query value so it broadcasts against out."""
        return self.from_bhsd(lse.unsqueeze(-1))

    def empty(
        self, batch: int, seq: int, heads: int, size: int, like: torch.Tensor
    ) -> torch.Tensor:
        shape = (batch, seq, heads, size) if self.seq_dim == 1 else (batch, heads, seq, size)
        return torch.empty(shape, dtype=like.dtype, device=like.device)

    @property
    def other(self) -> Layout:
        """The layout whose tensors are this one's with seq and heads swapped (a free view)."""
        return BHSD if self.seq_dim == 1 else BSHD


# How a tensor is stored relative to its declared layout (the wire-layout vote, agree/header.py)
STORED_AS_DECLARED, STORED_SWAPPED, STORED_EITHER = 1, 2, 3


def storage(x: torch.Tensor) -> int:
    """STORED_SWAPPED for a dense tensor whose seq and head dims are swapped in memory (xDiT's
    q: a (b, h, s, d) view of a (b, s, h, d) projection); STORED_EITHER when both or neither
    order is dense (a size-1 dim, or any strides: a copy either way)."""
    declared, swapped = x.is_contiguous(), x.transpose(1, 2).is_contiguous()
    if declared == swapped:
        return STORED_EITHER
    return STORED_SWAPPED if swapped else STORED_AS_DECLARED


def wire_swapped(votes: list[int]) -> bool:
    """Whether the ring moves Q and partials in the other layout: only if that copies nothing
    on any rank and saves a copy on one (every rank applies the same rule to the same votes)."""
    return STORED_AS_DECLARED not in votes and STORED_SWAPPED in votes


BSHD = Layout("bshd", seq_dim=1, head_dim=2)
BHSD = Layout("bhsd", seq_dim=2, head_dim=1)
LAYOUTS = {BSHD.name: BSHD, BHSD.name: BHSD}


def get_layout(name: str | Layout) -> Layout:
    if isinstance(name, Layout):
        return name
    try:
        return LAYOUTS[name]
    except KeyError:
        raise ValueError(f"unknown layout {name!r}; use one of {sorted(LAYOUTS)}") from None
