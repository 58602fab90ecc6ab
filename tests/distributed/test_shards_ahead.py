"""Zigzag shards cut ahead of their calls keep their proof.

A prefetching loader (or eval batches between training batches) cuts several sequences, of
several lengths, with `shard(x, causal=True)` before any of them reaches attention. Each cut
declares its length for the group; a causal call is accepted when its shards are a zigzag split
of any length this group declared (the last `DECLARED_LENGTHS`), and refused as before when not.
"""

from __future__ import annotations

from tests.harness import run_ranks, values
from tests.reference import exact_attention

LENGTHS = (8, 24, 16, 40)  # total tokens; each a multiple of 2N = 4


def _worker(rank, n):
    import torch
    import torch.distributed as dist

    from tokenring_xdit import shard
    from tokenring_xdit.ring import token_ring_attn_func
    from tokenring_xdit.ring.split.sharding import DECLARED_LENGTHS

    world = dist.group.WORLD
    torch.manual_seed(0)  # the same full sequences on every rank
    full = [torch.randn(3, 1, s, 2, 8, dtype=torch.float64) for s in LENGTHS]
    cut = [shard(x, world, causal=True, dim=2) for x in full]  # all cut before any call
    errors = []
    for x, (q, k, v) in zip(full, cut, strict=True):
        out = token_ring_attn_func(q, k, v, causal=True)
        ref, _ = exact_attention(*x, causal=True, layout="bshd")
        errors.append((out - shard(ref, world, causal=True)).abs().max().item())
    # contiguous (not zigzag) shards of a length never cut: still refused on every rank
    refused = None
    s = 12
    q = torch.randn(1, s // n, 2, 8, dtype=torch.float64)
    try:
        token_ring_attn_func(q, q, q, causal=True)
    except ValueError as exc:
        refused = str(exc)
    # the bound: after DECLARED_LENGTHS newer lengths, the first one is forgotten
    for i in range(DECLARED_LENGTHS):
        shard(torch.zeros(1, 4 * (100 + i)), world, causal=True)
    try:
        q, k, v = cut[0]
        token_ring_attn_func(q, k, v, causal=True)
        forgotten = None
    except ValueError as exc:
        forgotten = str(exc)
    return errors, refused, forgotten


def test_shards_cut_ahead_at_several_lengths_are_accepted():
    for errors, refused, forgotten in values(run_ranks(_worker, 2, timeout=240)):
        assert max(errors) < 1e-5, errors  # fp32 merge
        assert refused is not None and "zigzag" in refused, refused
        assert forgotten is not None and "zigzag" in forgotten, forgotten
