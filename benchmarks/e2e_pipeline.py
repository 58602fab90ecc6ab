"""End-to-end denoising latency: one GPU vs xDiT's default ring vs TokenRing, same weights/seed.

Full-size random-weight architectures (PixArt-alpha XL-2 1024, Flux.1-dev) from
tokenring_xdit.pipelines, bf16, latent output (the denoising loop only, as in anchors.md):
  torchrun --nproc_per_node=2 benchmarks/e2e_pipeline.py --model pixart --sizes 1024 2048 \
      --out $OUT/e2e_pixart.json
Rank 0 first times plain diffusers on its GPU (the "1 GPU" column), then both ranks wrap the
same pipeline in xDiT at ring degree = ranks and time xDiT's ring and TokenRing, switching with
tokenring_xdit.selection.set_xdit_ring_impl. Each timed call follows a short warm-up call.
"""

from __future__ import annotations

import argparse
import json
import os
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


def _timed(pipe, kwargs: dict, warmup_steps: int) -> tuple[float, torch.Tensor | None]:
    with torch.no_grad():
        pipe(
            **dict(
                kwargs,
                num_inference_steps=warmup_steps,
                generator=torch.Generator(device="cuda").manual_seed(0),
            )
        )
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = pipe(**kwargs)
        torch.cuda.synchronize()
    images = out.images if out is not None else None
    return time.perf_counter() - start, images


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(GUIDANCE), default="pixart")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup-steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import tokenring_xdit

    tokenring_xdit.install()
    import xfuser
    from xfuser.core.distributed import init_distributed_environment

    from tokenring_xdit import pipelines, selection

    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    init_distributed_environment(rank=rank, world_size=n, local_rank=local)
    text_len = 120 if args.model == "pixart" else 512
    built = pipelines.BUILDERS[args.model](
        "full", seed=0, dtype=torch.bfloat16, device="cuda", text_len=text_len
    )
    rows = {
        size: {"model": args.model, "size": size, "steps": args.steps, "ranks": n}
        for size in args.sizes
    }
    plain = {}
    if rank == 0:  # one GPU, plain diffusers, before xDiT rewires the transformer
        for size in args.sizes:
            t, lat = _timed(
                built.pipe,
                _call_kwargs(built, args.model, size, args.steps, args.seed),
                args.warmup_steps,
            )
            rows[size]["one_gpu_s"] = t
            plain[size] = lat
            print(json.dumps(rows[size]), flush=True)
    dist.barrier()
    engine_config, _ = xfuser.xFuserArgs(
        model=f"random-{args.model}",
        ring_degree=n,
        height=args.sizes[0],
        width=args.sizes[0],
        num_inference_steps=args.steps,
        output_type="latent",
        no_use_resolution_binning=True,
    ).create_config()
    xpipe = getattr(xfuser, WRAPPERS[args.model])(built.pipe, engine_config)
    for size in args.sizes:
        reference = plain.get(size)
        shape = [list(reference.shape) if rank == 0 else None]
        dist.broadcast_object_list(shape, src=0)
        if rank != 0:
            reference = torch.empty(*shape[0], device="cuda", dtype=torch.bfloat16)
        dist.broadcast(reference.contiguous(), src=0)
        outs = {}
        for impl in (selection.DEFAULT, selection.TOKEN_RING):
            selection.set_xdit_ring_impl(impl)
            t, lat = _timed(
                xpipe,
                _call_kwargs(built, args.model, size, args.steps, args.seed),
                args.warmup_steps,
            )
            t_max = torch.tensor([t], device="cuda")
            dist.all_reduce(t_max, op=dist.ReduceOp.MAX)
            rows[size][f"xdit_{impl}_s"] = t_max.item()
            outs[impl] = lat
        if rank == n - 1:  # xDiT returns the output on the last rank
            ring, token = outs[selection.DEFAULT].float(), outs[selection.TOKEN_RING].float()
            rows[size]["max_abs_latent_diff_token_vs_ring"] = (token - ring).abs().max().item()
            rows[size]["max_abs_latent_diff_token_vs_one_gpu"] = (
                (token - reference.float()).abs().max().item()
            )
            rows[size]["latent_abs_max"] = ring.abs().max().item()
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
            f"--steps {args.steps}",
            "xfuser": xfuser.__version__ if hasattr(xfuser, "__version__") else "0.7.0",
        }
        merged = result[0]
        for row in merged:
            row.update({k: v for k, v in rows[row["size"]].items() if k == "one_gpu_s"})
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": merged}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
