"""A ring of N as seen by ONE of its ranks: the real loops run that rank's work, with lanes that
send nothing and fill each receive buffer from a random pool (one copy, what the transfer would
write). benchmarks/replay_rank.py times a rank this way; tests/unit/test_benchmarks_ceiling.py
records the kernel calls the loops make."""

from __future__ import annotations

import torch


class LocalLane:
    """Stands in for a P2P lane on one GPU (same post/wait/step interface)."""

    def __init__(self, pool: dict):
        self.step = 0
        self._pool = pool

    def post(self, sends, recvs, what):
        for t, _peer in recvs:  # what the transfer would write
            t.copy_(_from_pool(self._pool, t))
        return []

    def wait(self, works=None) -> None:
        return None


def _from_pool(pool: dict, t: torch.Tensor) -> torch.Tensor:
    src = pool.get(t.dtype)
    if src is None or src.numel() < t.numel():
        gen = torch.Generator(device=t.device).manual_seed(len(pool))
        src = pool[t.dtype] = torch.randn(t.numel(), device=t.device, generator=gen).to(t.dtype)
    return src[: t.numel()].view(t.shape)


class LocalRing:
    """What the training loops use of a ring (rank, size, lanes()), with local lanes."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size, self._pool = rank, size, {}

    def lanes(self):
        return LocalLane(self._pool), LocalLane(self._pool)
