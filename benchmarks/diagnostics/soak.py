"""Soak: many TokenRing calls over cycling lengths, inference (CUDA graphs on) and training mixed;
does memory stay flat?

One cycle = for each of the 5 lengths, `--infer` inference calls (replays of that length's graph
after the first) then `--train` training calls (forward + backward: one call each), so with the
defaults 5 x (80 + 20) = 500 calls per cycle and 20 cycles = 10^4 calls. Every `--sample-every`
calls (default: one cycle) each rank records torch.cuda.memory_allocated, memory_reserved, the
allocator pool's segments / free bytes inside split blocks / allocation retries (POOL_STATS) and
its host RSS; at the end, the reserved pool after torch.cuda.empty_cache(); rank 0 writes it all
as JSON.

Verdict, per rank, on what the process holds: "flat" when GPU allocated and host RSS at the
last sample are less than 1 % above the sample at the end of the first cycle (every length, both
modes and every graph have been made by then), and the reserved pool after empty_cache() is at
most 1 % above the reserved pool of that first sample (so whatever the pool grew by was blocks
cached for reuse, not memory anything holds); "grew" otherwise. The reserved pool's own growth
(the caching allocator keeping freed segments of the lengths' different sizes) is reported as
`growth["gpu_reserved"]`, with its samples, not judged. The JSON's verdict is "flat" only if
every rank's is. Each sample is also printed by rank 0 as it is taken (calls, seconds, pool),
and `--max-seconds` ends the soak at the first sample past it (agreed by the ranks), so a slow
run still reports.

    torchrun --nproc_per_node=2 benchmarks/diagnostics/soak.py --out soak.json
    torchrun --nproc_per_node=2 benchmarks/diagnostics/soak.py --device cpu --calls 50 \
        --sample-every 10 --infer 4 --train 1 --lengths 16,24,32,40,48 --heads 2 --out s.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch
import torch.distributed as dist

GROWTH_LIMIT = 0.01  # "flat": the last sample < 1 % above the first cycle's end
MEASURES = ("gpu_allocated", "gpu_reserved", "host_rss")
HELD = ("gpu_allocated", "host_rss")  # judged; gpu_reserved is judged after empty_cache()


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--calls", type=int, default=10_000)
    p.add_argument("--lengths", default="4096,6144,8192,12288,16384", help="whole sequences")
    p.add_argument("--infer", type=int, default=80, help="inference calls per length per cycle")
    p.add_argument("--train", type=int, default=20, help="training calls per length per cycle")
    p.add_argument("--sample-every", type=int, default=None, help="default: one cycle")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument(
        "--max-seconds", type=float, default=None, help="end at the first sample past it"
    )
    p.add_argument("--out", type=Path)
    return p.parse_args()


def host_rss() -> int:
    """This process's resident set size in bytes (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# What the caching allocator's pool is made of (torch.cuda.memory_stats): how many segments it
# holds, how much of it is free space inside split blocks (fragmentation) and how often an
# allocation had to free cached blocks and retry; they tell whether a reserved pool that grows
# is blocks kept for reuse or something held.
POOL_STATS = {
    "segments": "segment.all.current",
    "inactive_split_bytes": "inactive_split_bytes.all.current",
    "alloc_retries": "num_alloc_retries",
}


def sample(calls: int, cuda: bool, start: float) -> dict:
    stats = torch.cuda.memory_stats() if cuda else {}
    return dict(
        calls=calls,
        seconds=round(time.monotonic() - start, 2),
        gpu_allocated=torch.cuda.memory_allocated() if cuda else 0,
        gpu_reserved=torch.cuda.memory_reserved() if cuda else 0,
        host_rss=host_rss(),
        **{name: int(stats.get(key, 0)) for name, key in POOL_STATS.items()},
    )


def verdict(samples: list[dict], first_cycle_calls: int, reserved_after_empty: int) -> dict:
    """Growth of each measure from the first sample at or after the first cycle to the last
    sample; "flat" when each held measure's is < GROWTH_LIMIT (a measure that is 0 throughout is
    flat) and the pool after empty_cache() is within GROWTH_LIMIT of that first sample's."""
    steady = [s for s in samples if s["calls"] >= first_cycle_calls]
    if len(steady) < 2:
        return {"verdict": "too short", "growth": {}}
    base, last = steady[0], steady[-1]
    growth = {m: (last[m] - base[m]) / base[m] if base[m] else 0.0 for m in MEASURES}
    peak = {m: max(s[m] for s in steady) for m in MEASURES}
    kept = reserved_after_empty <= base["gpu_reserved"] * (1 + GROWTH_LIMIT)
    flat = kept and all(growth[m] < GROWTH_LIMIT for m in HELD)
    return {"verdict": "flat" if flat else "grew", "growth": growth, "base": base, "peak": peak}


def _agreed_past(start: float, seconds: float, device: torch.device) -> bool:
    """Whether any rank is past `seconds` (every rank stops at the same call)."""
    late = torch.tensor([float(time.monotonic() - start > seconds)], device=device)
    dist.all_reduce(late, op=dist.ReduceOp.MAX)
    return bool(late.item())


def main() -> None:
    args = _args()
    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cpu")
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    os.environ.setdefault("TOKENRING_XDIT_CUDA_GRAPHS", "1")
    import tokenring_xdit as tr

    dtype = torch.bfloat16 if cuda else torch.float32
    lengths = [int(x) for x in args.lengths.split(",")]
    per_cycle = len(lengths) * (args.infer + args.train)
    every = args.sample_every or per_cycle
    gen = torch.Generator(device="cpu").manual_seed(0)
    kv_heads = max(args.heads // 4, 1)
    inputs, train_inputs = {}, {}
    for n in lengths:  # made once: the loop itself must allocate nothing that stays
        full = [torch.randn(1, n, h, args.head_dim, generator=gen) for h in (args.heads, kv_heads,
                                                                            kv_heads)]  # fmt: skip
        # inference is non-causal (the graphed path: causal calls run the training loop eagerly)
        inputs[n] = [tr.shard(x.to(device, dtype), None, causal=False) for x in full]
        split = tr.make_split(n, dist.get_world_size(), causal=True)
        train_inputs[n] = [
            *(tr.shard(x.to(device, dtype), None, split=split).requires_grad_() for x in full),
            split,
        ]
    schedule = [(n, train) for n in lengths for train in [False] * args.infer + [True] * args.train]
    samples, start, calls, finite = [], time.monotonic(), 0, True
    while calls < args.calls:
        for n, train in schedule:
            if train:
                q, k, v, split = train_inputs[n]
                out = tr.token_ring_attn_func(q, k, v, causal=True, split=split)
                out.float().square().mean().backward()
                q.grad = k.grad = v.grad = None
            else:
                with torch.no_grad():
                    out = tr.token_ring_attn(*inputs[n])[0]
            calls += 1
            if calls % every == 0:
                finite = finite and bool(torch.isfinite(out).all())  # syncs: done before sampling
                samples.append(sample(calls, cuda, start))
                if rank == 0:
                    print("sample", json.dumps(samples[-1]), flush=True)
                if args.max_seconds is not None and _agreed_past(start, args.max_seconds, device):
                    args.calls = calls
            if calls >= args.calls:
                break
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.monotonic() - start
    # what of the pool was only cached: the reserved pool once the allocator gave back every
    # segment nothing uses (graph pools and live tensors stay)
    if cuda:
        torch.cuda.empty_cache()
    after_empty = torch.cuda.memory_reserved() if cuda else 0
    everyone: list = [None] * dist.get_world_size()
    from tokenring_xdit.ring.graph_cache import RING_GRAPHS

    mine = dict(rank=rank, samples=samples, finite=finite, graph_stats=str(RING_GRAPHS.stats),
                gpu_reserved_after_empty_cache=after_empty)  # fmt: skip
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        ranks = [
            dict(r, **verdict(r["samples"], per_cycle, r["gpu_reserved_after_empty_cache"]))
            for r in everyone
        ]
        flat = all(r["verdict"] == "flat" for r in ranks)

        result = dict(
            verdict="flat" if flat else "grew",
            rule=f"per rank: {', '.join(HELD)} at the last sample < {GROWTH_LIMIT:.0%} above "
            f"the first sample at or after one cycle ({per_cycle} calls), and gpu_reserved after "
            f"empty_cache() <= {GROWTH_LIMIT:.0%} above that sample's gpu_reserved",
            calls=calls,
            cycles=calls / per_cycle,
            calls_per_cycle=per_cycle,
            lengths=lengths,
            infer_per_length=args.infer,
            train_per_length=args.train,
            heads=args.heads,
            head_dim=args.head_dim,
            device=str(device),
            dtype=str(dtype),
            seconds=round(elapsed, 1),
            calls_per_s=round(calls / elapsed, 1),
            ranks=ranks,
            machine=platform.node(),
            gpu=torch.cuda.get_device_name() if cuda else None,
            world_size=dist.get_world_size(),
        )
        text = json.dumps(result, indent=1, default=str)
        print(text)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
