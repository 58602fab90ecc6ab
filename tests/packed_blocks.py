"""The blocks of a causal packed call as the ring runs them, in global positions: per (key rank,
step) block of the plan (`doc_plan`, positions from `shard_positions`), whose queries and keys it
covers and its segments. tests/gpu/test_gpu_packed.py rebuilds the ring's decomposition on one
GPU from them; benchmarks/diagnostics/packed_partials_rounding.py emulates its roundings."""

from __future__ import annotations

from typing import NamedTuple

import torch

from tokenring_xdit.ring.packed.documents import Documents, doc_plan
from tokenring_xdit.ring.schedules import block_schedule
from tokenring_xdit.ring.schedules.blocks import part_slice
from tokenring_xdit.ring.split.sharding import shard_positions


class Block(NamedTuple):
    """One (key rank, step) block that runs a kernel: whose query part it holds (q_sl of the
    owner's shard), which part of the key rank's shard it covers (k_sl), both tiles' global
    positions, and its segments (tile coordinates)."""

    rank: int
    step: int
    owner: int
    q_sl: slice
    q_tile: torch.Tensor
    k_sl: slice
    k_tile: torch.Tensor
    segs: tuple


def blocks(bounds: tuple[int, ...], n: int, layout: str):
    """([Block] of the causal call in `layout` over n ranks, every rank's global positions)."""
    total = bounds[-1]
    pos = [shard_positions(total, r, n, cu_seqlens=list(bounds), layout=layout) for r in range(n)]
    plan = doc_plan(Documents(bounds), block_schedule(True, layout), (total // n,) * n, layout)
    out = []
    for r in range(n):
        for st in plan.steps[r]:
            segs = plan.block(r, st.step) if st.kernel else ()
            if not segs:
                continue
            q_sl = part_slice(st.q_part, len(pos[st.q_owner]))
            k_sl = part_slice(st.kv_part, len(pos[r]))
            tiles = (pos[st.q_owner][q_sl], k_sl, pos[r][k_sl])
            out.append(Block(r, st.step, st.q_owner, q_sl, *tiles, segs))
    return out, pos


def max_partials(bl: list[Block], r: int, length: int, side: str = "k") -> int:
    """The most segments (bf16 partials) any position of rank r's dQ (side "q") or dK/dV
    ("k") sums over the call's blocks."""
    count, idx = torch.zeros(length, dtype=torch.int64), torch.arange(length)
    for b in bl:
        if (b.owner if side == "q" else b.rank) != r:
            continue
        sl = b.q_sl if side == "q" else b.k_sl
        for sg in b.segs:
            lo, hi = (sg.q0, sg.q1) if side == "q" else (sg.k0, sg.k1)
            count[idx[sl][lo:hi]] += 1
    return int(count.max())
