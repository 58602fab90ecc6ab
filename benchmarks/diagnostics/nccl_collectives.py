"""NCCL collectives vs send/recv on one link: does an all-gather or an all-to-all move bytes faster
than the paired send/recv the planner's link patterns are fitted from?

On the multi-node stand-in (NET/Socket) the all-gather K/V ring ran 20-40 % faster than the
planner predicted from send/recv bandwidth: NCCL may give collectives more channels (and so
sockets) than point-to-point. Per message size (bytes each rank contributes), median of --iters:
  p2p_both_ways   r -> r+1 and r-1 -> r at once (batch_isend_irecv), bytes out per rank = size
  all_gather      all_gather_into_tensor, bytes out per rank = size x (N - 1)
  all_to_all      all_to_all_single of N x size, bytes out per rank = size x (N - 1)
Launch: torchrun --nproc_per_node=N benchmarks/diagnostics/nccl_collectives.py --out x.json
(or through benchmarks/multi_node.py across stand-in nodes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist


def _median_ms(fn, iters: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    t = torch.tensor([statistics.median(times)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _patterns(numel: int, mb: int, rank: int, n: int) -> dict:
    """name -> (fn, MB each rank sends) for one message size."""
    x = torch.empty(numel, dtype=torch.bfloat16, device="cuda")
    r = torch.empty_like(x)
    gathered = torch.empty(n * numel, dtype=torch.bfloat16, device="cuda")
    a2a_in, a2a_out = torch.empty_like(gathered), torch.empty_like(gathered)
    nxt, prv = (rank + 1) % n, (rank - 1) % n

    def p2p():
        ops = [dist.P2POp(dist.isend, x, nxt), dist.P2POp(dist.irecv, r, prv)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    return {
        "p2p_both_ways": (p2p, mb),
        "all_gather": (lambda: dist.all_gather_into_tensor(gathered, x), mb * (n - 1)),
        "all_to_all": (lambda: dist.all_to_all_single(a2a_out, a2a_in), mb * (n - 1)),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    rows = []
    for mb in (1, 4, 16, 64, 256):
        numel = mb * 2**20 // 2
        row = {"MB": mb, "ranks": n}
        for name, (fn, out_mb) in _patterns(numel, mb, rank, n).items():
            ms = _median_ms(fn, args.iters)
            row[f"{name}_ms"] = ms
            row[f"{name}_GBps_per_rank_out"] = out_mb * 2**20 / ms / 1e6
        if rank == 0:
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                              for k, v in row.items()}), flush=True)  # fmt: skip
        rows.append(row)
    if rank == 0:
        meta = {
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "command": f"torchrun --nproc_per_node={n} benchmarks/diagnostics/nccl_collectives.py",
        }
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
