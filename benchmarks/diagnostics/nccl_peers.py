"""NCCL P2P micro-benchmark: is two peers at once, or both directions, faster than one?

TokenRing's premise is that Q (to r+1) and partials (to another peer) travel at the same time.
This measures, per message size, the bandwidth of:
  one_peer_one_way   r -> r+1 only
  one_peer_both_ways r -> r+1 and r+1 -> r at once (ring attention at N = 2)
  two_peers          r -> r+1 and r -> r-1 at once (TokenRing's pattern at N >= 3)
  two_peers_two_comms  the same with the second transfer on its own communicator
Launch: torchrun --nproc_per_node=N benchmarks/diagnostics/nccl_peers.py --out $OUT/nccl_peers.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def _time(fn, iters=20, warmup=5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    t = torch.tensor([(time.perf_counter() - t0) / iters], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _run(*batches) -> None:
    works = [w for ops in batches for w in dist.batch_isend_irecv(ops)]
    for w in works:
        w.wait()


def _patterns(rank, n, a, b, ra, rb, other, size):
    """(name, fn, bytes each rank sends) for each traffic pattern."""
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    send_a, recv_a = dist.P2POp(dist.isend, a, nxt), dist.P2POp(dist.irecv, ra, prv)
    pats = []
    if n % 2 == 0:  # pairs (0->1, 2->3, ...) for the one-way case
        one = [send_a] if rank % 2 == 0 else [dist.P2POp(dist.irecv, ra, prv)]
        pats.append(("one_peer_one_way", lambda: _run(one), size))
    back = [dist.P2POp(dist.isend, b, prv), dist.P2POp(dist.irecv, rb, nxt)]
    back_own = [dist.P2POp(dist.isend, b, prv, other), dist.P2POp(dist.irecv, rb, nxt, other)]
    pats += [
        ("one_peer_both_ways", lambda: _run([send_a, recv_a]), size),
        ("two_peers", lambda: _run([send_a, recv_a] + back), 2 * size),
        ("two_peers_two_comms", lambda: _run([send_a, recv_a], back_own), 2 * size),
    ]
    return pats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    other = dist.new_group(list(range(n)))
    rows = []
    for mb in (1, 4, 16, 64, 256):
        numel = mb * 2**20 // 2
        a, b = (torch.empty(numel, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        ra, rb = torch.empty_like(a), torch.empty_like(b)

        size = numel * 2
        row = {"MB": mb, "ranks": n}
        for name, fn, moved in _patterns(rank, n, a, b, ra, rb, other, size):
            t = _time(fn)
            row[f"{name}_ms"] = t * 1e3
            row[f"{name}_GBps_per_rank_out"] = moved / t / 1e9
        if rank == 0:
            print(
                json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}),
                flush=True,
            )
        rows.append(row)
    if rank == 0:
        meta = {
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "nccl_p2p_disable": os.environ.get("NCCL_P2P_DISABLE", "0"),
            "command": f"torchrun --nproc_per_node={n} benchmarks/diagnostics/nccl_peers.py",
        }
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
