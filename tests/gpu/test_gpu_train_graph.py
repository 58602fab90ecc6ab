"""Training calls replayed as CUDA graphs (RingConfig.train_cuda_graph, ring/training/run.py)
equal the eager calls (marker `gpu`):

python -m pytest -m gpu tests/gpu/test_gpu_train_graph.py -q -s -rA

Rings of 2 and 3 processes on ONE GPU over the IPC transport (a gloo world group, as
test_gpu_ipc_ring.py), and a ring of 2 GPUs over NCCL where the machine has them. Per case
(causal zigzag and non-causal, MHA 8/8 and GQA 8/2, bf16, head size 128, kernel `auto`: cuDNN
on H100/H200), three rounds with new inputs, each like two layers of a model: forward A,
forward B (same shapes: the same graph), backward B, backward A, once with the switch off and
once on, on the same inputs. The first graphed forward and backward run eagerly and capture;
every later call replays. All results are compared after the last round, so an output or a
saved tensor that was a graph's static buffer (overwritten by a later replay) would show.
- out and lse: bitwise equal (the same kernels on the same inputs, the same fused merge);
- dq, dk, dv: within bf16 noise (|graphed - eager| <= 2^-5 max |eager|): cuDNN's backward
  adds dQ with atomics, so it is not bitwise run to run even eagerly; new random inputs per
  round make any stale or aliased result differ by O(1);
- the ring graph cache: per case 2 captures (forward, backward) and 2 x (3 rounds x 2 layers
  - 1) replays, no refusal, over IPC as over NCCL (a capture's IPC copies read tensors that
  the posting work keeps alive until the caller's stream joins them: freed sooner, a later
  allocation of the same capture took their memory and a replay's gradients were 69-120x off).
"""

from __future__ import annotations

import functools

import pytest
import torch

from tests.harness import run_ranks, values

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# name, causal, query heads, K/V heads, travel (GQA on CUDA: `auto` moves K/V both ways)
CASES = [
    ("causal-mha", True, 8, 8, "auto"),
    ("causal-gqa", True, 8, 2, "auto"),
    ("causal-gqa-q", True, 8, 2, "q"),
    ("noncausal-mha", False, 8, 8, "auto"),
    ("noncausal-gqa", False, 8, 2, "auto"),
    ("noncausal-gqa-q", False, 8, 2, "q"),
]
ROUNDS, LOCAL, D = 3, 256, 128
GRAD_NOISE = 2.0**-5  # of the largest eager gradient


def _layer(inputs, pos, causal, cfg, travel):
    """Forward of this rank's shard of one layer's (q, k, v): (out, lse, ql, kl, vl)."""
    from tokenring_xdit.ring import token_ring_attn_func

    ql, kl, vl = (x[:, pos].detach().clone().requires_grad_() for x in inputs[:3])
    out, lse, _ = token_ring_attn_func(
        ql, kl, vl, causal=causal, positions=pos if causal else None, config=cfg,
        return_attn_probs=True, travel=travel,
    )  # fmt: skip
    return out, lse, ql, kl, vl


def _two_layers(layers, pos, causal, cfg, travel):
    """Forward A, forward B, backward B, backward A: [(out, lse, dq, dk, dv)] of A and B."""
    a = _layer(layers[0], pos, causal, cfg, travel)
    b = _layer(layers[1], pos, causal, cfg, travel)
    b[0].backward(layers[1][3][:, pos])
    a[0].backward(layers[0][3][:, pos])
    return [(x[0].detach(), x[1].detach(), x[2].grad, x[3].grad, x[4].grad) for x in (a, b)]


def _inputs(gen, n, h, h_kv):
    """One layer's global (q, k, v, dO), bf16, equal on every rank (same seed)."""
    shapes = [(1, LOCAL * n, hh, D) for hh in (h, h_kv, h_kv, h)]
    return [torch.randn(s, device="cuda", generator=gen).bfloat16() for s in shapes]


def _rel(want: torch.Tensor, got: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


def _case(case, rank, n, off, on) -> dict:
    from tokenring_xdit.ring.graph_cache import RING_GRAPHS
    from tokenring_xdit.ring.split.sharding import shard_positions

    name, causal, h, h_kv, travel = case
    stats = RING_GRAPHS.stats
    before = (stats.captures, stats.replays, len(stats.refused))
    pos = shard_positions(LOCAL * n, rank, n, causal=causal, device="cuda")
    eager, graphed = [], []
    for r in range(ROUNDS):
        gen = torch.Generator(device="cuda").manual_seed(100 * r + len(name) + h_kv)
        layers = [_inputs(gen, n, h, h_kv) for _ in "ab"]
        eager += _two_layers(layers, pos, causal, off, travel)
        graphed += _two_layers(layers, pos, causal, on, travel)
    torch.cuda.synchronize()
    bitwise, noise = [], []
    for e, g in zip(eager, graphed, strict=True):
        bitwise.append([torch.equal(x, y) for x, y in zip(e[:2], g[:2], strict=True)])
        noise.append([_rel(x, y) for x, y in zip(e[2:], g[2:], strict=True)])
    return dict(
        bitwise=bitwise,
        grad_noise=noise,
        captures=stats.captures - before[0],
        replays=stats.replays - before[1],
        refused=list(stats.refused[before[2] :]),
    )


def _worker(rank: int, n: int, one_gpu: bool) -> dict:
    import torch.distributed as dist

    from tokenring_xdit.config import current
    from tokenring_xdit.ring.comm import setup_token_ring_group

    torch.cuda.set_device(0 if one_gpu else rank)
    setup_token_ring_group(dist.group.WORLD)
    # from the environment (the IPC transport), the switch off and on
    off, on = (current().replace(train_cuda_graph=x) for x in (False, True))
    result = {case[0]: _case(case, rank, n, off, on) for case in CASES}
    torch.cuda.synchronize()
    return result


@functools.cache
def _launch(transport: str, n: int) -> list:
    if transport == "ipc":
        env = {"TOKENRING_XDIT_TRANSPORT": "ipc"}
        return values(run_ranks(_worker, n, True, timeout=600, env=env))
    return values(run_ranks(_worker, n, False, timeout=600, backend="nccl"))


RINGS = [("ipc", 2), ("ipc", 3), ("nccl", 2)]


def _needs(transport: str, n: int) -> None:
    if transport == "nccl" and torch.cuda.device_count() < n:
        pytest.skip(f"the NCCL ring needs {n} GPUs")


@pytest.mark.parametrize("transport,n", RINGS, ids=[f"{t}-{n}" for t, n in RINGS])
def test_graphed_training_calls_equal_eager_ones(transport, n):
    _needs(transport, n)
    failures = []
    for rank, res in enumerate(_launch(transport, n)):
        for name, got in res.items():
            worst = max(max(x) for x in got["grad_noise"])
            print(f"{transport} N={n} rank {rank} {name}: out/lse bitwise {got['bitwise']}, "
                  f"grads vs eager {worst:.3g} of max")  # fmt: skip
            if not all(all(x) for x in got["bitwise"]):
                failures.append(f"{transport} N={n} rank {rank} {name}: out/lse not bitwise")
            if not worst <= GRAD_NOISE:
                failures.append(f"{transport} N={n} rank {rank} {name}: grads {worst:.3g}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("transport,n", RINGS, ids=[f"{t}-{n}" for t, n in RINGS])
def test_each_half_is_captured_once_and_replayed(transport, n):
    _needs(transport, n)
    calls = 2 * ROUNDS  # graphed forwards (and backwards) per case
    for rank, res in enumerate(_launch(transport, n)):
        for name, got in res.items():
            counts = (got["captures"], got["replays"], got["refused"])
            print(f"{transport} N={n} rank {rank} {name}: captures, replays, refused {counts}")
            want = (2, 2 * (calls - 1), [])
            assert counts == want, (transport, n, rank, name, counts)
