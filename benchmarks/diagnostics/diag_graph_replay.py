"""Diagnostic: do replayed TokenRing CUDA graphs give the eager answer, at every ring size?

  torchrun --nproc_per_node=4 benchmarks/diagnostics/diag_graph_replay.py [--out FILE.json]
For each case (kernel, head size, layout, merge, ring size, piece count) it makes fresh random
bf16 inputs per call, runs `token_ring_attn` graphed (call 0 = eager warm-up + capture, calls
1.. = replays) and eager on the same inputs, and prints the worst |graphed - eager| and
|graphed - exact| over the replays (exact: fp32 attention of the gathered sequence). Rings of 2
are subgroups of the launch. `eager_fused` runs the Triton merge without any graph, to tell a
kernel fault from a capture fault.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from tokenring_xdit.config import ENV
from tokenring_xdit.ring import graph_cache as graphs, setup_token_ring_group, token_ring_attn
from tokenring_xdit.ring.merge import fused as fused_merge, partials as merge
from tokenring_xdit.ring.kernels import math
from tokenring_xdit.ring.tensor_layout import get_layout


@dataclass(frozen=True)
class Case:
    kernel: str = "cudnn"
    d: int = 72
    layout: str = "bhsd"
    fused: bool = True
    ring: int = 0  # 0: every rank of the launch
    q_len: int = 2048
    heads: int = 16
    final_chunks: int | None = None
    eager_fused: bool = False


def _cases(world: int) -> list[Case]:
    cases = [
        Case(),
        Case(fused=False),
        Case(d=128, heads=24),
        Case(kernel="torch_flash"),
        Case(kernel="torch_efficient"),
        Case(layout="bshd"),
        Case(final_chunks=1),
        Case(eager_fused=True),
        Case(q_len=1000),
    ]
    if world > 2:
        cases += [Case(ring=2), Case(ring=2, d=128, heads=24)]
    return cases


def _force_fused_merge(on: bool) -> None:
    """Make PartialMerge take the Triton merge outside captures too (or restore it)."""
    cls = merge.PartialMerge
    if on and not hasattr(cls, "_diag_init"):
        cls._diag_init = cls.__init__

        def init(self, block_out, *args, **kwargs):
            cls._diag_init(self, block_out, *args, **kwargs)
            self._fused = fused_merge.serves(block_out)

        cls.__init__ = init
    elif not on and hasattr(cls, "_diag_init"):
        cls.__init__ = cls._diag_init
        del cls._diag_init


def _run_case(case: Case, rank: int, world: int, rings: dict) -> dict:
    n = case.ring or world
    group = rings[n]
    ring_rank, first = dist.get_rank(group), rank - dist.get_rank(group)
    lay = get_layout(case.layout)
    os.environ[ENV["fused_merge"][0]] = "1" if case.fused else "0"
    _force_fused_merge(case.eager_fused)
    graphs.clear_graphs()
    worst = {"graph_vs_eager": 0.0, "graph_vs_exact": 0.0, "eager_vs_exact": 0.0}
    for call in range(4):
        gen = torch.Generator(device="cuda").manual_seed(1000 * call + first)  # same per ring
        shape = (
            (1, case.q_len * n, case.heads, case.d)
            if case.layout == "bshd"
            else (1, case.heads, case.q_len * n, case.d)
        )
        full = [
            torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3)
        ]
        local = [x.chunk(n, dim=lay.seq_dim)[ring_rank].contiguous() for x in full]
        kw = dict(
            group=group, layout=case.layout, kernel=case.kernel, final_chunks=case.final_chunks
        )
        with torch.no_grad():
            graphed = token_ring_attn(*local, cuda_graph=not case.eager_fused, **kw)[0]
            eager = token_ring_attn(*local, cuda_graph=False, **kw)[0]
            exact = math(*full, case.d**-0.5, lay)[0].chunk(n, dim=lay.seq_dim)[ring_rank]
        if call == 0 and not case.eager_fused:
            continue  # the warm-up call is eager by construction
        for name, a, b in (
            ("graph_vs_eager", graphed, eager),
            ("graph_vs_exact", graphed, exact),
            ("eager_vs_exact", eager, exact),
        ):
            worst[name] = max(worst[name], (a.float() - b.float()).abs().max().item())
    _force_fused_merge(False)
    captured = sum(g is not None for g in graphs.RING_GRAPHS._graphs.values())
    return dict(asdict(case), ring=n, rank=rank, graphs=captured, **worst)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    rings = {world: dist.group.WORLD}
    setup_token_ring_group(dist.group.WORLD)
    if world > 2:
        pairs = [dist.new_group([r, r + 1]) for r in range(0, world - world % 2, 2)]
        mine = pairs[rank // 2] if rank < 2 * len(pairs) else None
        setup_token_ring_group(mine)
        rings[2] = mine
    rows = []
    for case in _cases(world):
        if case.ring and rings.get(case.ring) is None:
            continue
        rows.append(_run_case(case, rank, world, rings))
    gathered = [None] * world
    dist.all_gather_object(gathered, rows)
    if rank == 0:  # one line per case: the worst rank
        for per_rank in zip(*gathered, strict=True):
            row = dict(per_rank[0])
            row.pop("rank")
            for name in ("graph_vs_eager", "graph_vs_exact", "eager_vs_exact"):
                row[name] = f"{max(r[name] for r in per_rank):.1e}"
            print(json.dumps(row), flush=True)
    if rank == 0 and args.out:
        meta = {
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_NCCL"))},
        }
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": [r for rs in gathered for r in rs]}, f, indent=1)
    graphs.clear_graphs()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
