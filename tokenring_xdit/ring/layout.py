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
