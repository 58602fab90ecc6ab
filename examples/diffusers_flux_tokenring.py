"""Flux.1 with diffusers' own context parallelism, TokenRing as its ring.

    torchrun --nproc_per_node=2 examples/diffusers_flux_tokenring.py              # ring 2
    torchrun --nproc_per_node=4 examples/diffusers_flux_tokenring.py --ulysses_degree 2
    torchrun --nproc_per_node=2 examples/diffusers_flux_tokenring.py --ring_impl default
    torchrun --nproc_per_node=2 examples/diffusers_flux_tokenring.py \\
        --model /path/to/FLUX.1-dev --prompt "a red fox in the snow" --steps 28

The diffusers code is diffusers' documented API, unchanged:
`pipe.transformer.enable_parallelism(config=ContextParallelConfig(ring_degree=..,
ulysses_degree=..))`. The one switch is TokenRing's selection, made on every rank BEFORE
enable_parallelism: the environment variable TOKENRING_XDIT_RING_IMPL=token_ring, or (what this
script does with --ring_impl, default token_ring)
`tokenring_xdit.set_ring_impl("token_ring")`.

Without --model the real Flux.1-dev transformer architecture (19 + 38 blocks, with --tiny one of
each and a tiny VAE: the default on CPU) is built with seeded random weights, and T5/CLIP are
replaced by seeded random embeddings (--text_len tokens), so --prompt has no effect; nothing is
downloaded. Image and text tokens must each divide by ulysses x ring (diffusers' equal split)
unless --ring_anything. GPU: NCCL, bf16, cuda:LOCAL_RANK, backend _native_cudnn; CPU: gloo, fp32,
backend _native_flash through tokenring_xdit's opt-in CPU shims. Rank 0 saves the image under
--output_dir and prints the time and how many TokenRing calls ran
(`tokenring_xdit.calls_by_host()`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads in main(), after the arguments parse: a bad flag answers at once
    import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _shared  # noqa: E402

from tokenring_xdit.tools.rank_exit import one_line_usage_errors  # noqa: E402

TINY_PIXELS = 128  # the tiny VAE's own default would be 16 x 16 px


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ring_impl", choices=("token_ring", "default"), default="token_ring")
    p.add_argument("--ulysses_degree", type=int, default=1)
    p.add_argument("--ring_degree", type=int, help="default: world size / ulysses degree")
    p.add_argument("--ring_anything", action="store_true", help="allow uneven sequence shards")
    p.add_argument("--model", help="a local diffusers Flux checkpoint folder (default: random)")
    p.add_argument("--tiny", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--prompt", default="a red fox in the snow", help="used with --model only")
    p.add_argument("--height", type=int, help=f"default: 1024, or {TINY_PIXELS} with --tiny")
    p.add_argument("--width", type=int, help="default: as --height")
    p.add_argument("--steps", type=int, help="default: 28, or 4 with --tiny")
    p.add_argument("--text_len", type=int, help="random weights: default 512, or 16 with --tiny")
    p.add_argument("--guidance_scale", type=float, default=3.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--attention_backend", help="default: _native_cudnn (GPU), _native_flash (CPU)")
    p.add_argument("--output_dir", default="results")
    return one_line_usage_errors(p).parse_args()


def build(args, device: torch.device, dtype: torch.dtype):
    """(FluxPipeline, keyword arguments that stand in for the prompt)."""
    if args.model:
        from diffusers import FluxPipeline

        pipe = FluxPipeline.from_pretrained(args.model, torch_dtype=dtype).to(device)
        return pipe, dict(prompt=args.prompt, height=args.height, width=args.width)
    from tokenring_xdit.tools import pipelines

    built = pipelines.flux(
        "tiny" if args.tiny else "full",
        seed=args.seed,
        dtype=dtype,
        device=device,
        height=args.height,
        width=args.width,
        text_len=args.text_len or (16 if args.tiny else 512),
    )
    return built.pipe, dict(built.call_kwargs, height=built.height, width=built.width)


def main() -> None:
    args = parse_args()
    _shared.quiet_hosts()  # before diffusers and transformers are imported
    import torch
    import torch.distributed as dist

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a --model that is not local fails instead
    cuda = torch.cuda.is_available()
    if not cuda:  # diffusers' context parallelism on gloo: see docs/diffusers.md
        from tokenring_xdit.patches import diffusers_cpu

        diffusers_cpu.enable()
    import tokenring_xdit
    from tokenring_xdit.hosts import selection

    # The package's .pth applies the patches on import when installed; this covers PYTHONPATH runs.
    tokenring_xdit.install()
    selection.set_xdit_ring_impl(args.ring_impl)  # the one switch, before enable_parallelism

    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else None
    if cuda:
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    args.tiny = (not cuda) if args.tiny is None else args.tiny
    if not args.model:  # random weights: the real resolution, or a small one for --tiny
        args.height = args.height or args.width or (TINY_PIXELS if args.tiny else 1024)
        args.width = args.width or args.height
    pipe, prompt_kwargs = build(args, device, torch.bfloat16 if cuda else torch.float32)
    pipe.set_progress_bar_config(disable=rank != 0)

    from diffusers import ContextParallelConfig

    backend = args.attention_backend or ("_native_cudnn" if cuda else "_native_flash")
    pipe.transformer.set_attention_backend(backend)
    ring = args.ring_degree or world // args.ulysses_degree
    pipe.transformer.enable_parallelism(
        config=ContextParallelConfig(
            ring_degree=ring, ulysses_degree=args.ulysses_degree, ring_anything=args.ring_anything
        )
    )
    steps = args.steps or (4 if args.tiny else 28)
    with torch.inference_mode():
        start = time.perf_counter()
        image = pipe(
            num_inference_steps=steps,
            guidance_scale=args.guidance_scale,
            # a CPU generator: the same starting noise on every rank and device
            generator=torch.Generator().manual_seed(args.seed),
            **prompt_kwargs,
        ).images[0]
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    if rank == 0:
        os.makedirs(args.output_dir, exist_ok=True)
        # every setting that changes the image is in its name: runs do not overwrite each other
        name = (
            f"diffusers_flux_{args.ring_impl}_u{args.ulysses_degree}r{ring}_"
            f"{image.width}x{image.height}_{steps}steps_seed{args.seed}.png"
        )
        image.save(os.path.join(args.output_dir, name))
        print(
            f"{steps} steps at {image.width}x{image.height} px in {seconds:.2f} s on {world} "
            f"ranks (ulysses {args.ulysses_degree} x ring {ring}, {backend}); ring: "
            f"{args.ring_impl}; TokenRing calls on rank 0: "
            f"{tokenring_xdit.calls_by_host().get('diffusers', 0)}; image: "
            f"{os.path.join(args.output_dir, name)}"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    from tokenring_xdit.tools.rank_exit import run_main

    run_main(main, __file__)  # our errors: one line per rank (LOG_LEVEL=debug: traceback)
