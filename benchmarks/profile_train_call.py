"""Where one TokenRing training call's time goes (forward + backward), rank by rank.

  torchrun --nproc_per_node=2 benchmarks/profile_train_call.py --out $OUT/train_profile.json
  torchrun --nproc_per_node=2 benchmarks/profile_train_call.py --hold-back 0 1 --out ...
For each shape (multi_node_train.py's "name:heads:kv_heads:head_dim:causal|full"; default
causal GQA 32/8 and non-causal MHA 32, head size 128, bf16) and global length (--seqs, default
16384): one differentiable `token_ring_attn_func` call plus its backward, timed with CUDA events
(median of --iters), then --calls of them under torch.profiler. Per rank:
- `timeline` (profile_ring_call.breakdown, shared): attention busy, NCCL outside attention
  (transfers in the open or waiting for the peer), merges/sums/copies/other outside both, and
  no GPU work at all (host gaps, launches);
- `ceiling_ms`: the kernels-only time of the blocks this rank runs (replay_rank's kernels_ms:
  the schedule's block kernels back to back on this GPU, nothing else);
- `ideal_ms`: SDPA cuDNN forward + backward of the whole sequence on one GPU (K/V heads
  repeated under GQA) / N, so efficiency = ideal / call, the issue's measure;
- `lost`: where the measured time above the ideal goes, in % of the call (ideal -> ceiling ->
  measured): split (ceiling - ideal), attention inflation (attention busy in the ring - the
  ceiling), NCCL in the open, merges/copies in the open, GPU idle, and the rest (event-timed
  call - profiled window).
`--hold-back 0 1` profiles each shape with RingConfig.train_hold_back off and on, alternating;
`--graph 0 1` likewise with RingConfig.train_cuda_graph (forward and backward replayed as CUDA
graphs; the warm-up calls capture them).
`--events` adds every GPU activity of one call (kind, stream, start/duration us, name).
--device cpu (gloo): the same wiring at a tiny size (the CPU test); numbers mean little there.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))  # sibling scripts
from multi_node_train import parse_shapes  # noqa: E402
from profile_ring_call import kernel_ms, write_result  # noqa: E402
from replay_rank import _kernels_fn  # noqa: E402

DEFAULT_SHAPES = "gqa-32-8:32:8:128:causal,mha-32:32:32:128:full"


def _timed(fn, warmup: int, iters: int, cuda: bool) -> float:
    """Median ms of fn() (CUDA events on a GPU, wall clock on the CPU)."""
    times = []
    for i in range(warmup + iters):
        if cuda:
            start, end = (torch.cuda.Event(enable_timing=True) for _ in "se")
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            fn()
            ms = (time.perf_counter() - t0) * 1e3
        if i >= warmup:
            times.append(ms)
    return statistics.median(times)


def _whole(seq, h, hk, d, causal, device, dtype):
    """SDPA forward + backward over the whole sequence on this device (cuDNN on a GPU)."""
    gen = torch.Generator(device=device).manual_seed(1)
    q, k, v, do = (torch.randn(1, h, seq, d, device=device, generator=gen).to(dtype)
                   for _ in range(4))  # fmt: skip
    for x in (q, k, v):
        x.requires_grad_()

    def run():
        for x in (q, k, v):
            x.grad = None
        sdpa = torch.nn.functional.scaled_dot_product_attention
        if device == "cuda":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                out = sdpa(q, k, v, is_causal=causal)
        else:
            out = sdpa(q, k, v, is_causal=causal)
        out.backward(do)

    return run  # hk is only the ring's: the whole-sequence call gets every K/V head (ulysses')


def lost_percent(row: dict) -> dict[str, float]:
    """Where the call's time above the ideal goes, in % of the call (they sum to 100 - eff%)."""
    call, tl = row["call_ms"], row["timeline"]
    parts = dict(
        split=row["ceiling_ms"] - row["ideal_ms"],
        attention_inflation=tl["attention_ms"] - row["ceiling_ms"],
        nccl_in_the_open=tl["nccl_in_the_open_ms"],
        merges_copies_in_the_open=tl["merge_copy_other_in_the_open_ms"],
        gpu_idle=tl["gpu_idle_ms"],
        rest=call - tl["window_ms"],
    )
    return {k: round(100 * v / call, 2) for k, v in parts.items()}


def _profile(rank, n, shape, seq, hold_back, args, cuda, graph=0):
    from tokenring_xdit.config import current
    from tokenring_xdit.ring import token_ring_attn_func
    from tokenring_xdit.ring.seam.prepare import CallOptions, prepare
    from tokenring_xdit.ring.split.sharding import make_split

    name, h, hk, d, causal = shape
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    gen = torch.Generator(device=device).manual_seed(rank)
    heads = (h, hk, hk, h)
    q, k, v, do = (
        torch.randn(1, seq // n, hh, d, device=device, generator=gen)
        .to(dtype)
        .requires_grad_(i < 3)
        for i, hh in enumerate(heads)
    )
    # (an older package, profiled as a baseline with --hold-back 0, has no such setting)
    on = {name: True for name, x in (("train_hold_back", hold_back), ("train_cuda_graph", graph))
          if x}  # fmt: skip
    cfg = current().replace(**on) if on else current()

    split = make_split(seq, n, causal=True) if causal else None  # the shards' zigzag split

    def call():
        token_ring_attn_func(q, k, v, causal=causal, config=cfg, split=split).backward(do)

    call_ms = _timed(call, args.warmup, args.iters, cuda)
    timeline: dict = {}
    by_kind = kernel_ms(call, args.calls, timeline, cuda=cuda)
    row = dict(shape=name, heads=h, kv_heads=hk, head_dim=d, causal=causal, seq=seq, ring=n,
               rank=rank, hold_back=bool(hold_back), graph=bool(graph), call_ms=call_ms,
               kernels_ms=by_kind, timeline=timeline)  # fmt: skip
    if args.events:
        row["events"] = []
        kernel_ms(call, 1, events=row["events"], cuda=cuda)
    # the kernels-only ceiling of this rank: the prepared call's own BlockCall (pair, schedule)
    with torch.no_grad():
        options = CallOptions(causal=causal, config=cfg, split=split)
        prepared = prepare(q, k, v, options, grad=True)
    qd, kd, vd, dod = (x.detach() for x in (q, k, v, do))
    kernels = _kernels_fn(prepared.call, rank, n, qd, kd, vd, dod)
    row["ceiling_ms"] = _timed(kernels, 1, args.iters, cuda)
    del kernels
    whole = _whole(seq, h, hk, d, causal, device, dtype)
    row["ideal_ms"] = _timed(whole, 1, args.iters, cuda) / n
    del whole
    row["efficiency"] = row["ideal_ms"] / call_ms
    row["ceiling_efficiency"] = row["ideal_ms"] / row["ceiling_ms"]
    row["of_ceiling"] = row["ceiling_ms"] / call_ms
    row["lost_percent"] = lost_percent(row)
    if cuda:
        torch.cuda.empty_cache()
    return row


def _say(rows: list[dict]) -> None:
    """One line per shape: ideal -> ceiling -> measured, and the worst rank's lost percents."""
    for r in rows:
        lost = ", ".join(f"{k} {v:+.1f}" for k, v in r["lost_percent"].items())
        print(
            f"{r['shape']} {r['seq']} ring {r['ring']} rank {r['rank']} hold_back "
            f"{int(r['hold_back'])} graph {int(r.get('graph', 0))}: {r['call_ms']:.3f} ms; "
            f"ideal 100% -> ceiling "
            f"{100 * r['ceiling_efficiency']:.1f}% -> measured {100 * r['efficiency']:.1f}% "
            f"({100 * r['of_ceiling']:.1f}% of the ceiling); lost % of the call: {lost}",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--seqs", default="16384", help="global sequence lengths")
    ap.add_argument("--hold-back", nargs="+", type=int, default=[0], help="train_hold_back values")
    ap.add_argument("--graph", nargs="+", type=int, default=[0], help="train_cuda_graph values")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--calls", type=int, default=5, help="profiled calls")
    ap.add_argument("--events", action="store_true", help="every GPU activity of one call")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from tokenring_xdit.ring.comm import setup_token_ring_group

    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    setup_token_ring_group(dist.group.WORLD)
    rows = []
    for shape in parse_shapes(args.shapes):
        for seq in map(int, args.seqs.split(",")):
            for hold_back, graph in itertools.product(args.hold_back, args.graph):
                mine = _profile(rank, n, shape, seq, hold_back, args, cuda, graph)
                every = [None] * n
                dist.all_gather_object(every, mine)
                rows += every
                if rank == 0:
                    _say(every)
    if rank == 0:
        write_result(args.out, "profile_train_call", n, rows, cuda)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
