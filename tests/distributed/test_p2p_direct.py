"""The lanes' direct issue moves the same bytes as torch's batch_isend_irecv.

TorchLane.post issues a step's sends and receives straight on the lane's process group (gloo:
one op at a time, as torch's own non-coalescing path; NCCL: one coalesced batch, checked on GPUs
in tests/gpu/test_gpu_p2p_direct.py). Over 3 gloo ranks, the same ring calls run both ways
(`lanes.DIRECT_P2P` on, then off) on the world ring and on a ring of global ranks [1, 2], whose
ring ranks are not its global ranks: inference, causal training and packed causal training
give bitwise equal outputs and gradients, the same traffic counters, and match exact fp64
attention. A transfer that torch refuses at issue raises TokenRingCommError naming the step,
the lane and the peers either way, and marks the ring unusable.
"""

from __future__ import annotations

import pytest

from tests.harness import run_ranks
from tests.reference import exact_attention

WORLD = 3
SEQ, HEADS, KV_HEADS, DIM = 24, 4, 2, 16  # SEQ divides by 2N for N = 2, 3
CU = [0, 5, 6, 17, 24]  # packed documents of the packed training call
TOL = 1e-5


def _inputs(torch):
    gen = torch.Generator().manual_seed(3)
    shapes = ((HEADS,), (KV_HEADS,), (KV_HEADS,), (HEADS,))
    return [torch.randn(1, SEQ, h, DIM, generator=gen, dtype=torch.float64) for (h,) in shapes]


def _calls(torch, group, full):
    """Inference, causal training and packed causal training on `group`: every tensor out."""
    import tokenring_xdit
    from tokenring_xdit import token_ring_attn_func
    from tokenring_xdit.ring import token_ring_attn

    f32 = [x.float() for x in full]
    n, r = torch.distributed.get_world_size(group), torch.distributed.get_rank(group)
    plain = [x.chunk(n, dim=1)[r] for x in f32[:3]]
    with torch.no_grad():
        out, lse = token_ring_attn(*plain, group=group, kernel="math")
    got = {"inference": out, "inference_lse": lse}
    for name, cu in (("causal", None), ("packed", CU)):
        split = tokenring_xdit.make_split(f32[0].shape[1], n, causal=True, cu_seqlens=cu)
        shards = [tokenring_xdit.shard(x, group, split=split) for x in f32]
        q, k, v = (x.requires_grad_() for x in shards[:3])
        out = token_ring_attn_func(q, k, v, causal=True, group=group, split=split)
        out.backward(shards[3])
        got.update({name: out.detach(), f"{name}_dq": q.grad, f"{name}_dk": k.grad})
        got[f"{name}_dv"] = v.grad
    return got


def _both_ways(rank, n):
    import torch
    import torch.distributed as dist

    from tokenring_xdit.ring.comm import COUNTERS, lanes, setup_token_ring_group

    batched = lanes._batched
    fallbacks = [0]

    def counted(*args):  # observes which path each post took; the post itself is unchanged
        fallbacks[0] += 1
        return batched(*args)

    lanes._batched = counted
    full = _inputs(torch)
    setup_token_ring_group(dist.group.WORLD)  # before a group rank 0 is not in (torch's naming)
    rings = {"world": (dist.group.WORLD, [0, 1, 2]), "ranks 1-2": (dist.new_group([1, 2]), [1, 2])}
    results, counters, taken = {}, {}, {}
    for direct in (True, False):
        lanes.DIRECT_P2P = direct
        COUNTERS.reset()
        for name, (group, members) in rings.items():
            if rank in members:
                fallbacks[0] = 0
                results[(direct, name)] = _calls(torch, group, full)
                taken[(direct, name)] = fallbacks[0]
        counters[direct] = (COUNTERS.q_messages, COUNTERS.partial_messages,
                            COUNTERS.bytes_sent, dict(COUNTERS.by_peer))  # fmt: skip
    lanes.DIRECT_P2P, lanes._batched = True, batched
    return results, counters, taken


@pytest.mark.timeout(180)
def test_direct_issue_equals_batch_isend_irecv():
    import torch

    results = run_ranks(_both_ways, WORLD, timeout=120)
    for res in results:
        assert res.ok, res.trace
    full = _inputs(torch)
    for res in results:
        got, counters, taken = res.value
        assert counters[True] == counters[False], (res.rank, counters)
        assert counters[True][0] > 0 and counters[True][2] > 0, counters
        for (direct, ring), tensors in got.items():
            # every post took the direct path when it was on, none when it was off
            assert (taken[(direct, ring)] == 0) == direct, (res.rank, ring, taken)
            other = got[(not direct, ring)]
            for name, t in tensors.items():
                assert torch.equal(t, other[name]), (res.rank, ring, name)
        # and the results are right (not merely equal): inference against exact attention
        for ring, members in (("world", [0, 1, 2]), ("ranks 1-2", [1, 2])):
            if res.rank not in members:
                continue
            r, n = members.index(res.rank), len(members)
            exact, lse = exact_attention(*full[:3])
            out = got[(True, ring)]["inference"].double()
            assert (out - exact.chunk(n, dim=1)[r]).abs().max() < TOL, (res.rank, ring)
            ref_lse = lse.chunk(n, dim=-1)[r]
            assert (got[(True, ring)]["inference_lse"].double() - ref_lse).abs().max() < TOL


def _refused(rank, n, direct):
    """Every rank posts a send torch refuses at issue (gloo takes only contiguous tensors)."""
    import torch
    import torch.distributed as dist

    from tokenring_xdit.ring.comm import TokenRingCommError, comms_of, lanes

    lanes.DIRECT_P2P = direct
    group = dist.new_group(list(range(n)))  # its own ring: this one ends unusable
    comms = comms_of(group)
    q_lane, out_lane = lanes.torch_lanes(comms, rank)
    assert (q_lane._direct is not None) == direct
    bad = torch.zeros(4, 4).t()
    out_lane.step = 3
    try:
        out_lane.post([(bad, (rank + 1) % n)], [], "partial")
        return "no error"
    except TokenRingCommError as exc:
        message = str(exc)
    try:
        comms.ensure_usable()
        after = "usable"
    except TokenRingCommError as exc:
        after = str(exc)
    # gloo may finish making a group on one rank before the other: a rank that exits at once
    # breaks the other's connect ("Connection closed by peer"; seen with two test workers)
    dist.barrier()
    return message, after


@pytest.mark.timeout(120)
@pytest.mark.parametrize("direct", [True, False])
def test_refused_transfer_names_step_lane_and_peer(direct):
    n = 2
    results = run_ranks(_refused, n, direct, timeout=90)
    for res in results:
        assert res.ok, res.trace
        message, after = res.value
        peer = (res.rank + 1) % n
        assert "partial transfer at step 3 on the return lane" in message, message
        assert f"send to ring rank {peer} (global rank {peer})" in message, message
        assert f"failed on ring rank {res.rank} (global rank {res.rank})" in message, message
        assert "contiguous" in message and "likely causes" in message, message
        assert "unusable after an earlier failure" in after, after
