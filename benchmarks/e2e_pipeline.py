"""End-to-end denoising latency: one GPU vs xDiT's default ring vs TokenRing, same weights/seed.

Full-size random-weight architectures (PixArt-alpha XL-2 1024, Flux.1-dev) from
tokenring_xdit.tools.pipelines, bf16, latent output (the denoising loop only, as in anchors.md):
  torchrun --nproc_per_node=2 benchmarks/e2e_pipeline.py --model pixart --sizes 1024 2048 \
      --out $OUT/e2e_pixart.json
Rank 0 first times plain diffusers on its GPU (the "1 GPU" column), then both ranks wrap the
same pipeline in xDiT at ring degree = ranks and time xDiT's ring and TokenRing, switching with
tokenring_xdit.hosts.selection.set_xdit_ring_impl. With --graph-transformer (default) every
setting, the one-GPU one too, is timed again with the transformer replayed as CUDA graphs
(tokenring_xdit.hosts.transformer_graphs). Each timed call follows a short warm-up call.
--profile DIR adds a torch.profiler summary per setting (GPU busy time vs wall time, kernel
launches).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

GUIDANCE = {"pixart": 4.5, "flux": 3.5}
WRAPPERS = {"pixart": "xFuserPixArtAlphaPipeline", "flux": "xFuserFluxPipeline"}


def _call_kwargs(built, model: str, size: int, steps: int, seed: int) -> dict:
    kwargs = dict(
        built.call_kwargs,
        height=size,
        width=size,
        num_inference_steps=steps,
        guidance_scale=GUIDANCE[model],
        output_type="latent",
        generator=torch.Generator(device="cuda").manual_seed(seed),
    )
    return kwargs


def _timed(pipe, kwargs: dict, warmup_steps: int, repeats: int) -> tuple[float, torch.Tensor]:
    """Median wall time of `repeats` calls after one warm-up call; the last call's output."""
    times = []
    with torch.no_grad():
        pipe(
            **dict(
                kwargs,
                num_inference_steps=warmup_steps,
                generator=torch.Generator(device="cuda").manual_seed(0),
            )
        )
        seed = kwargs["generator"].initial_seed()
        for _ in range(repeats):  # the same starting noise every time
            kwargs = dict(kwargs, generator=torch.Generator(device="cuda").manual_seed(seed))
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = pipe(**kwargs)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    images = out.images if out is not None else None
    return statistics.median(times), images


def _profile(pipe, kwargs: dict, steps: int, label: str, out_dir: str, rank: int) -> dict:
    """Run `steps` denoising steps under torch.profiler; write the op tables; return the summary.

    gpu_busy_s sums the device time of every CUDA kernel and memcpy: when it is far below the wall
    time, the GPU waits on the host (launch-bound), not on NCCL or the kernels.
    """
    from torch.profiler import ProfilerActivity, profile

    seed = kwargs["generator"].initial_seed()
    kwargs = dict(kwargs, num_inference_steps=steps)
    with torch.no_grad():
        kwargs["generator"] = torch.Generator(device="cuda").manual_seed(seed)
        pipe(**kwargs)  # warm for this step count
        kwargs["generator"] = torch.Generator(device="cuda").manual_seed(seed)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            pipe(**kwargs)
            torch.cuda.synchronize()
            wall = time.perf_counter() - start
    events = prof.key_averages()
    busy_us = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA")
    nccl_us = sum(
        e.self_device_time_total
        for e in events
        if e.device_type.name == "CUDA" and "nccl" in e.key.lower()
    )
    launches = sum(e.count for e in events if "LaunchKernel" in e.key)
    summary = dict(
        label=label,
        steps=steps,
        wall_s=wall,
        gpu_busy_s=busy_us / 1e6,
        nccl_s=nccl_us / 1e6,
        kernel_launches=launches,
        graph_launches=sum(e.count for e in events if e.key == "cudaGraphLaunch"),
    )
    if rank == 0:
        with open(os.path.join(out_dir, f"profile_{label}.txt"), "w") as f:
            f.write(json.dumps(summary) + "\n\n")
            f.write(events.table(sort_by="self_cpu_time_total", row_limit=40) + "\n")
            f.write(events.table(sort_by="self_device_time_total", row_limit=30) + "\n")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(GUIDANCE), default="pixart")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup-steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per setting (median)")
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--profile",
        metavar="DIR",
        help="also profile each ring over --profile-steps steps at the first size (op tables "
        "written to DIR by rank 0; summaries added to the JSON)",
    )
    ap.add_argument("--profile-steps", type=int, default=5)
    ap.add_argument("--ulysses", type=int, default=1, help="ulysses degree (ring = ranks / it)")
    ap.add_argument(
        "--one-gpu",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time plain diffusers on rank 0's GPU (the '1 GPU' column; default on)",
    )
    ap.add_argument(
        "--graph-transformer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time each setting with the transformer replayed as CUDA graphs "
        "(tokenring_xdit.hosts.transformer_graphs; default on)",
    )
    args = ap.parse_args()
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    if args.warmup_steps < 2 or args.steps < 2:
        # diffusers' PixArt pipeline indexes the scheduler's output differently for one step
        ap.error("--steps and --warmup-steps must be at least 2")

    import tokenring_xdit

    tokenring_xdit.install()
    import xfuser
    from xfuser.core.distributed import init_distributed_environment

    from tokenring_xdit.hosts import selection, transformer_graphs
    from tokenring_xdit.tools import pipelines

    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    init_distributed_environment(rank=rank, world_size=n, local_rank=local)
    text_len = 120 if args.model == "pixart" else 512
    built = pipelines.BUILDERS[args.model](
        "full", seed=0, dtype=torch.bfloat16, device="cuda", text_len=text_len
    )
    if args.ulysses < 1 or n % args.ulysses:
        raise SystemExit(f"--ulysses {args.ulysses} must divide the {n} ranks")
    rows = {
        size: {
            "model": args.model,
            "size": size,
            "steps": args.steps,
            "ranks": n,
            "ulysses": args.ulysses,
            "ring": n // args.ulysses,
        }
        for size in args.sizes
    }
    solo = [dist.new_group([r]) for r in range(n)]  # rank 0's one-GPU graph agrees with itself
    plain = {}
    if rank == 0 and args.one_gpu:  # plain diffusers, before xDiT rewires the transformer
        for size in args.sizes:
            kwargs = _call_kwargs(built, args.model, size, args.steps, args.seed)
            if args.profile and size == args.sizes[0]:
                rows[size]["profile_one_gpu"] = _profile(
                    built.pipe,
                    kwargs,
                    args.profile_steps,
                    f"{args.model}{size}_one_gpu",
                    args.profile,
                    rank,
                )
            rows[size]["one_gpu_s"], plain[size] = _timed(
                built.pipe, kwargs, args.warmup_steps, args.repeats
            )
            if args.graph_transformer:
                transformer_graphs.graph_transformer(built.pipe.transformer, solo[0])
                rows[size]["one_gpu_graph_s"], lat = _timed(
                    built.pipe, kwargs, args.warmup_steps, args.repeats
                )
                stats = transformer_graphs.graph_stats(built.pipe.transformer)
                rows[size]["graph_stats_one_gpu_graph"] = dict(vars(stats))
                rows[size]["max_abs_latent_diff_one_gpu_graph_vs_eager"] = (
                    (lat.float() - plain[size].float()).abs().max().item()
                )
                transformer_graphs.ungraph_transformer(built.pipe.transformer)
            print(json.dumps(rows[size]), flush=True)
    dist.barrier()
    engine_config, _ = xfuser.xFuserArgs(
        model=f"random-{args.model}",
        ulysses_degree=args.ulysses,
        ring_degree=n // args.ulysses,
        height=args.sizes[0],
        width=args.sizes[0],
        num_inference_steps=args.steps,
        output_type="latent",
        no_use_resolution_binning=True,
    ).create_config()
    xpipe = getattr(xfuser, WRAPPERS[args.model])(built.pipe, engine_config)
    variants = [(impl, False) for impl in (selection.DEFAULT, selection.TOKEN_RING)]
    if args.graph_transformer:
        variants += [(impl, True) for impl in (selection.DEFAULT, selection.TOKEN_RING)]
    for size in args.sizes:
        reference = plain.get(size)
        if args.one_gpu:
            shape = [list(reference.shape) if rank == 0 else None]
            dist.broadcast_object_list(shape, src=0)
            if rank != 0:
                reference = torch.empty(*shape[0], device="cuda", dtype=torch.bfloat16)
            dist.broadcast(reference.contiguous(), src=0)
        outs = {}
        for impl, graphed in variants:
            label = f"{impl}_graph" if graphed else impl
            selection.set_xdit_ring_impl(impl)
            if graphed:
                transformer_graphs.graph_transformer(built.pipe.transformer)
            kwargs = _call_kwargs(built, args.model, size, args.steps, args.seed)
            t, lat = _timed(xpipe, kwargs, args.warmup_steps, args.repeats)
            t_max = torch.tensor([t], device="cuda")
            dist.all_reduce(t_max, op=dist.ReduceOp.MAX)
            rows[size][f"xdit_{label}_s"] = t_max.item()
            outs[label] = lat
            if args.profile and size == args.sizes[0]:
                rows[size][f"profile_{label}"] = _profile(
                    xpipe,
                    kwargs,
                    args.profile_steps,
                    f"{args.model}{size}_{label}_rank{rank}",
                    args.profile,
                    rank,
                )
            if graphed:
                stats = transformer_graphs.graph_stats(built.pipe.transformer)
                rows[size][f"graph_stats_{label}"] = dict(vars(stats))
                transformer_graphs.ungraph_transformer(built.pipe.transformer)
        if rank == n - 1:  # xDiT returns the output on the last rank
            ring = outs[selection.DEFAULT].float()
            for label, lat in outs.items():
                if label == selection.DEFAULT:
                    continue
                lat = lat.float()
                rows[size][f"max_abs_latent_diff_{label}_vs_ring"] = (lat - ring).abs().max().item()
                if reference is not None:
                    rows[size][f"max_abs_latent_diff_{label}_vs_one_gpu"] = (
                        (lat - reference.float()).abs().max().item()
                    )
            rows[size]["latent_abs_max"] = ring.abs().max().item()
            if reference is not None:
                rows[size]["one_gpu_latent_abs_max"] = reference.float().abs().max().item()
            print(json.dumps(rows[size]), flush=True)
    result = [None]
    if rank == n - 1:
        result = [list(rows.values())]
    dist.broadcast_object_list(result, src=n - 1)
    if rank == 0:
        meta = {
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "command": f"torchrun --nproc_per_node={n} benchmarks/e2e_pipeline.py "
            f"--model {args.model} --sizes {' '.join(map(str, args.sizes))} "
            f"--steps {args.steps} --ulysses {args.ulysses}",
            "xfuser": xfuser.__version__ if hasattr(xfuser, "__version__") else "0.7.0",
        }
        merged = result[0]
        for row in merged:
            row.update({k: v for k, v in rows[row["size"]].items() if "one_gpu" in k})
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": merged}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
