"""Packed training through the ring's CUDA graphs (ring/training/run.py; marker `gpu`):

python -m pytest -m gpu tests/gpu/test_gpu_packed_graphs.py -q -s -rA

A real NCCL ring of 2 and of 4 GPUs (where the machine has them), both layouts, cuDNN per
segment and flash_varlen, bf16 GQA 8/2, d 128: per (layout, kernel) three new packings (one
document of a single token each) of three layers, run as a model runs them (every forward, then
every backward) eagerly and with cuda_graph=True on the same inputs. Replays equal eager calls,
each half of a packing is captured once, and the ring keeps its last two packings' graphs.
"""

from __future__ import annotations

import random

import pytest
import torch

from tests.harness import run_ranks, values

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


GRAPH_COMBOS = [("zigzag", "cudnn"), ("zigzag", "flash_varlen"), ("documents", "flash_varlen"),
                ("documents", "cudnn")]  # fmt: skip
GRAPH_PACKINGS, GRAPH_LAYERS, GRAPH_LOCAL = 3, 3, 1024
GRAD_NOISE = 2.0**-5  # of the largest eager gradient (cuDNN's and flash's dQ use atomics)


def _packing(rng: random.Random, total: int) -> list[int]:
    """Random documents filling `total`, one of them a single token (the one-token blocks that
    cuDNN per segment hands to torch flash)."""
    cu = [0, 1]
    while cu[-1] < total:
        cu.append(min(total, cu[-1] + rng.randint(total // 32, total // 3)))
    return cu


def _packed_layers(ins, split, kernel, graphs):
    """Forward of every layer, then their backwards (autograd: the last layer's first), as a
    model runs them: [(out, dq, dk, dv)] per layer. The documents go beside the split, as a
    tensor (as transformers' batches carry them)."""
    from dataclasses import replace

    from tokenring_xdit import token_ring_attn_func

    leaves = [[x.detach().clone().requires_grad_() for x in layer[:3]] for layer in ins]
    given = {"split": replace(split, docs=None), "cu_seqlens": torch.tensor(split.docs.bounds)}
    outs = [
        token_ring_attn_func(*qkv, causal=True, kernel=kernel, cuda_graph=graphs, **given)
        for qkv in leaves
    ]
    torch.autograd.backward(outs, [layer[3] for layer in ins])
    return [(o.detach(), *(x.grad for x in qkv)) for o, qkv in zip(outs, leaves, strict=True)]


def _graph_worker(rank, n):
    """Per (layout, kernel): GRAPH_PACKINGS new packings of GRAPH_LAYERS layers each (their
    own inputs), eager and with graphs on, on the same inputs; compared after the last packing
    (a result that was a graph's buffer, overwritten by a later replay, would show). Per
    packing the graph cache's counts of the graphed run, and how many graphs it holds after."""
    import torch.distributed as dist

    from tokenring_xdit import make_split, shard
    from tokenring_xdit.ring import setup_token_ring_group
    from tokenring_xdit.ring.graph_cache import RING_GRAPHS, clear_graphs

    torch.cuda.set_device(rank)
    setup_token_ring_group(dist.group.WORLD)
    total, h, hk, d = GRAPH_LOCAL * n, 8, 2, 128
    result = {}
    for c, (layout, kernel) in enumerate(GRAPH_COMBOS):
        clear_graphs()
        rng = random.Random(100 + c)  # the same packings on every rank
        eager, graphed, counts, held = [], [], [], []
        for p in range(GRAPH_PACKINGS):
            cu = _packing(rng, total)
            split = make_split(total, n, causal=True, cu_seqlens=cu, layout=layout)
            gen = torch.Generator(device="cuda").manual_seed(1000 * c + p)
            ins = []
            for _ in range(GRAPH_LAYERS):
                full = [torch.randn(1, total, hh, d, device="cuda", generator=gen).bfloat16()
                        for hh in (h, hk, hk, h)]  # fmt: skip
                ins.append([shard(x, split=split) for x in full])
            eager += _packed_layers(ins, split, kernel, False)
            s = RING_GRAPHS.stats
            before = (s.captures, s.replays, s.dropped, len(s.refused))
            graphed += _packed_layers(ins, split, kernel, True)
            after = (s.captures, s.replays, s.dropped, len(s.refused))
            counts.append([b - a for a, b in zip(before, after, strict=True)])
            held.append(len(RING_GRAPHS))
        torch.cuda.synchronize()
        bitwise = [torch.equal(e[0], g[0]) for e, g in zip(eager, graphed, strict=True)]
        noise = [
            max(((y.float() - x.float()).abs().max() / x.float().abs().max()).item()
                for x, y in zip(e[1:], g[1:], strict=True))
            for e, g in zip(eager, graphed, strict=True)
        ]  # fmt: skip
        result[f"{layout}/{kernel}"] = dict(
            out_bitwise=bitwise, grad_noise=max(noise), counts=counts, held=held,
            refused=sorted(set(RING_GRAPHS.stats.refused))[:3],
        )  # fmt: skip
    clear_graphs()
    return result


@pytest.mark.parametrize("n", [2, 4])
def test_packed_training_replays_equal_eager_and_old_packings_are_dropped(n):
    """Packed training with graphs on (cuda_graph=True), a real NCCL ring of n GPUs, both
    layouts, cuDNN per segment and flash_varlen, bf16 GQA 8/2, d 128:

    - every layer's out bitwise equal to the eager call's (the first call of each half runs
      eagerly and captures; the others replay), dq/dk/dv within bf16 noise (atomics);
    - per packing 2 captures (forward, backward) and 2 x (layers - 1) replays, no refusal;
    - the ring keeps the graphs of its last PACKINGS_KEPT = 2 packings: the third packing's
      first call drops the first packing's 2 graphs, so the cache holds 2, 4, 4 graphs.
    """
    from tokenring_xdit.ring.graph_cache import PACKINGS_KEPT

    if torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} GPUs")
    assert PACKINGS_KEPT == 2
    want_counts = [[2, 2 * (GRAPH_LAYERS - 1), 0, 0]] * 2 + [[2, 2 * (GRAPH_LAYERS - 1), 2, 0]]
    failures = []
    for rank, res in enumerate(values(run_ranks(_graph_worker, n, backend="nccl", timeout=600))):
        for name, got in res.items():
            print(f"N={n} rank {rank} {name}: {got}")
            if not all(got["out_bitwise"]):
                failures.append(f"N={n} rank {rank} {name}: out not bitwise {got['out_bitwise']}")
            if not got["grad_noise"] <= GRAD_NOISE:
                failures.append(f"N={n} rank {rank} {name}: grads {got['grad_noise']:.3g}")
            if got["counts"] != want_counts or got["held"] != [2, 4, 4] or got["refused"]:
                failures.append(f"N={n} rank {rank} {name}: graph counts {got}")
    assert not failures, "\n".join(failures)
