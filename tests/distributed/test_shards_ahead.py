"""Zigzag shards cut ahead of their calls keep their proof: each carries its split.

A prefetching loader (or eval batches between training batches) cuts several sequences, of
several lengths, before any of them reaches attention. Each batch keeps the `Split` it was cut
by and its call passes it (`split=`): accepted in any order, however many other sequences were
cut in between (no table of earlier cuts decides a call); a call without its split is refused on
every rank as before, even right after `shard` cut its shards.
"""

from __future__ import annotations

from tests.harness import run_ranks, values
from tests.reference import exact_attention

LENGTHS = (8, 24, 16, 40)  # total tokens; each a multiple of 2N = 4


def _worker(rank, n):
    import torch
    import torch.distributed as dist

    from tokenring_xdit import make_split, shard
    from tokenring_xdit.ring import token_ring_attn_func

    world = dist.group.WORLD
    torch.manual_seed(0)  # the same full sequences on every rank
    full = [torch.randn(3, 1, s, 2, 8, dtype=torch.float64) for s in LENGTHS]
    splits = [make_split(s, n, causal=True) for s in LENGTHS]
    cut = [shard(x, world, split=sp, dim=2) for x, sp in zip(full, splits, strict=True)]
    for i in range(100):  # many more cuts in between: nothing is remembered of them
        shard(torch.zeros(1, 4 * (100 + i)), world, causal=True)
    errors = []
    for x, (q, k, v), sp in reversed(list(zip(full, cut, splits, strict=True))):
        out = token_ring_attn_func(q, k, v, causal=True, split=sp)
        ref, _ = exact_attention(*x, causal=True, layout="bshd")
        errors.append((out - shard(ref, world, split=sp)).abs().max().item())
    try:  # the shards of the last cut, without their split: refused
        q, k, v = shard(full[0], world, causal=True, dim=2)
        token_ring_attn_func(q, k, v, causal=True)
        refused = None
    except ValueError as exc:
        refused = str(exc)
    return errors, refused


def test_shards_cut_ahead_at_several_lengths_are_accepted_with_their_split():
    for errors, refused in values(run_ranks(_worker, 2, timeout=240)):
        assert max(errors) < 1e-5, errors  # fp32 merge
        assert refused is not None and "needs proof" in refused and "split=" in refused, refused
