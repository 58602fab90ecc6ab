"""The lanes' direct NCCL issue equals torch's batch_isend_irecv (marker `gpu`):

python -m pytest -m gpu tests/gpu/test_gpu_p2p_direct.py -q

On every GPU (2 to 4 ranks, NCCL), the same ring calls run with the direct issue
(`lanes.DIRECT_P2P`, one coalesced batch started and ended on the process group) and forced
through batch_isend_irecv: eager inference, a CUDA-graph capture and its replay (NCCL P2P inside
capture), and a packed causal training call (forward + backward). Forward outputs are bitwise
equal, gradients equal to bf16 rounding, both match fp64 attention, every post took the path
asked for, and a transfer NCCL refuses at issue raises TokenRingCommError naming the step, the
lane and the peer either way (the direct one refused first: a batch it opened must be closed,
or the forced round's NCCL calls on this thread would never run).
"""

from __future__ import annotations

import pytest
import torch

from tests.harness import run_ranks, values

pytestmark = pytest.mark.gpu

TOKENS, HEADS, KV_HEADS, DIM = 4096, 8, 2, 128
BF16_TOL = 2e-2


def _full(torch):
    gen = torch.Generator(device="cuda").manual_seed(5)
    return [
        torch.randn(1, TOKENS, h, DIM, device="cuda", generator=gen).to(torch.bfloat16)
        for h in (HEADS, KV_HEADS, KV_HEADS, HEADS)
    ]


def _calls(torch, full, cu):
    """Eager inference, captured + replayed inference, packed causal training: tensors out."""
    import torch.distributed as dist

    import tokenring_xdit
    from tokenring_xdit import token_ring_attn_func
    from tokenring_xdit.ring import token_ring_attn
    from tokenring_xdit.ring.graph_cache import RING_GRAPHS, clear_graphs

    n, r = dist.get_world_size(), dist.get_rank()
    plain = [x.chunk(n, dim=1)[r] for x in full[:3]]
    got = {}
    clear_graphs()  # the other mode's graph would be replayed otherwise (keys do not hold it)
    with torch.no_grad():
        got["eager"] = token_ring_attn(*plain, kernel="cudnn", cuda_graph=False)
        captured = token_ring_attn(*plain, kernel="cudnn", cuda_graph=True)
        replayed = token_ring_attn(*plain, kernel="cudnn", cuda_graph=True)
    got.update(captured=captured, replayed=replayed, graphs=len(RING_GRAPHS))
    got["capture_refused"] = list(RING_GRAPHS.stats.refused)
    split = tokenring_xdit.make_split(full[0].shape[1], n, causal=True, cu_seqlens=cu)
    shards = [tokenring_xdit.shard(x, split=split) for x in full]
    q, k, v = (x.requires_grad_() for x in shards[:3])
    out = token_ring_attn_func(q, k, v, causal=True, split=split, kernel="cudnn")
    out.backward(shards[3])
    got.update(packed=out.detach(), dq=q.grad, dk=k.grad, dv=v.grad)
    torch.cuda.synchronize()
    return got


def _refused(torch, rank, n):
    """A post NCCL refuses at issue (a CPU tensor: the lane's group has no CPU backend; NCCL
    only warns about a non-contiguous one), on a ring of its own."""
    import torch.distributed as dist

    from tokenring_xdit.ring.comm import TokenRingCommError, comms_of, lanes

    comms = comms_of(dist.new_group(list(range(n))))
    _, out_lane = lanes.torch_lanes(comms, rank)
    out_lane.step = 2
    bad = torch.zeros(64)
    try:
        out_lane.post([(bad, (rank + 1) % n)], [], "partial")
        return "no error"
    except TokenRingCommError as exc:
        return str(exc)


def _worker(rank, n):
    import torch.distributed as dist

    from tokenring_xdit.ring.comm import comms_of, lanes, setup_token_ring_group

    setup_token_ring_group(dist.group.WORLD)
    batched, fallbacks = lanes._batched, [0]

    def counted(*args):  # observes which path each post took; the post itself is unchanged
        fallbacks[0] += 1
        return batched(*args)

    lanes._batched = counted
    full = _full(torch)
    cu = [0, 700, 713, 2048, 2049, 3500, TOKENS]
    results = {}
    for direct in (True, False):
        lanes.DIRECT_P2P = direct
        fallbacks[0] = 0
        got = _calls(torch, full, cu)
        got["fallback_posts"] = fallbacks[0]
        got["refused"] = _refused(torch, rank, n)
        results[direct] = got
    lanes.DIRECT_P2P, lanes._batched = True, batched
    comms = comms_of(dist.group.WORLD)
    coalesced = [lanes._DIRECT[g].device.type for g in (comms.q, comms.out)]
    return {
        "coalesced_on": coalesced,
        "results": {d: _host(g) for d, g in results.items()},
        "exact": _exact_errors(full, results[True], rank, n),
    }


def _host(got):
    """Tensors to the CPU (the launcher pickles results)."""
    out = {}
    for key, value in got.items():
        if isinstance(value, tuple):
            value = tuple(x.float().cpu() for x in value)
        elif isinstance(value, torch.Tensor):
            value = value.float().cpu()
        out[key] = value
    return out


def _exact_errors(full, got, rank, n):
    from tests.reference import exact_attention

    out, lse = exact_attention(*(x.double() for x in full[:3]))
    want = out.chunk(n, dim=1)[rank], lse.chunk(n, dim=-1)[rank]
    return {
        key: max((a.double() - b).abs().max().item() for a, b in zip(got[key], want, strict=True))
        for key in ("eager", "replayed")
    }


def test_direct_nccl_issue_equals_batch_isend_irecv():
    n = 4 if torch.cuda.device_count() >= 4 else 2  # TOKENS splits in 2n zigzag chunks
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs (NCCL P2P between ranks)")
    for rank, res in enumerate(values(run_ranks(_worker, n, backend="nccl", timeout=300))):
        assert res["coalesced_on"] == ["cuda", "cuda"], (rank, res["coalesced_on"])
        direct, batch = res["results"][True], res["results"][False]
        assert direct["fallback_posts"] == 0 and batch["fallback_posts"] > 0, rank
        for mode in (direct, batch):  # NCCL P2P inside capture: the call was captured
            assert mode["graphs"] == 1, (rank, mode["graphs"], mode["capture_refused"])
        for key in ("eager", "captured", "replayed"):
            for a, b in zip(direct[key], batch[key], strict=True):
                assert torch.equal(a, b), (rank, key)
        assert torch.equal(direct["packed"], batch["packed"]), rank
        for key in ("dq", "dk", "dv"):
            err = (direct[key] - batch[key]).abs().max().item()
            assert err <= BF16_TOL, (rank, key, err)
        for key, err in res["exact"].items():
            assert err <= BF16_TOL, (rank, key, err)
        peer = (rank + 1) % n
        for mode in (direct, batch):
            message = mode["refused"]
            assert "partial transfer at step 2 on the return lane" in message, message
            assert f"send to ring rank {peer} (global rank {peer})" in message, message
            assert f"failed on ring rank {rank} (global rank {rank})" in message, message
