"""PixArt-alpha on xDiT (xfuser 0.7.0) with TokenRing as the ring of USP.

    torchrun --nproc_per_node=2 examples/pixart_tokenring.py                  # CPU: tiny, random
    torchrun --nproc_per_node=2 examples/pixart_tokenring.py --ring_degree 2  # GPU: full size
    torchrun --nproc_per_node=4 examples/pixart_tokenring.py --ulysses_degree 2 --ring_degree 2
    torchrun --nproc_per_node=2 examples/pixart_tokenring.py --ring_degree 2 \\
        --model /path/to/PixArt-XL-2-1024-MS --prompt "a red fox in the snow"

xDiT's flags (--ulysses_degree, --ring_degree, --use_cfg_parallel, --height, --width,
--num_inference_steps, --guidance_scale, --seed, --output_type, ...) work as in xDiT's
examples/pixartalpha_example.py, plus --ring_impl_type {default,token_ring} (this script's
default: token_ring) and --tiny. Without --model the real PixArt-alpha XL-2 1024 architecture is
built with seeded random weights (--tiny: a 2-layer model with a tiny VAE, the default on CPU)
and the T5 text encoder is replaced by seeded random prompt embeddings, so --prompt has no effect
then. Nothing is downloaded. GPU: NCCL, bf16, cuda:LOCAL_RANK; CPU: gloo, fp32, xDiT's CPU mode.
The last rank saves the images under --output_dir and prints the time of each step.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _shared  # noqa: E402  (_shared must set CPU mode up before xfuser is imported)

DEVICE = _shared.set_up()

import torch  # noqa: E402
from xfuser import xFuserPixArtAlphaPipeline  # noqa: E402
from xfuser.core.distributed import get_runtime_state, get_world_group  # noqa: E402

from tokenring_xdit.tools import pipelines  # noqa: E402


def build(args, engine_config, device: str):
    """(xDiT pipeline, keyword arguments that stand in for the prompt)."""
    dtype = _shared.dtype_for(DEVICE)
    if not args.random_weights:
        pipe = xFuserPixArtAlphaPipeline.from_pretrained(
            pretrained_model_name_or_path=args.model,
            engine_config=engine_config,
            torch_dtype=dtype,
        ).to(device)
        return pipe, dict(prompt=args.prompt, use_resolution_binning=args.use_resolution_binning)
    built = pipelines.pixart(
        "tiny" if args.tiny else "full",
        seed=args.seed,
        dtype=dtype,
        device=device,
        height=args.height,
        width=args.width,
        text_len=16 if args.tiny else 120,
    )
    return xFuserPixArtAlphaPipeline(built.pipe, engine_config), built.call_kwargs


def main() -> None:
    args, engine_args, engine_config, input_config = _shared.parse_args(
        "PixArt-alpha on xDiT with TokenRing", DEVICE
    )
    args.use_resolution_binning = not args.no_use_resolution_binning
    device = _shared.local_device(DEVICE)
    is_last = get_world_group().rank == get_world_group().world_size - 1
    if is_last and (note := _shared.random_prompt_note(args)):
        print(note)
    pipe, prompt_kwargs = build(args, engine_config, device)
    pipe.module.set_progress_bar_config(disable=not is_last)  # diffusers' tqdm bar, last rank
    timer = _shared.StepTimer(device)

    def call(steps: int, output_type: str):
        return pipe(
            height=input_config.height,
            width=input_config.width,
            num_inference_steps=steps,
            guidance_scale=input_config.guidance_scale,
            output_type=output_type,
            # a CPU generator: the same starting noise on every device
            generator=torch.Generator().manual_seed(input_config.seed),
            callback=lambda step, t, latents: timer.mark(),
            callback_steps=1,
            **prompt_kwargs,
        )

    with torch.inference_mode():
        if args.warmup_call_steps > 0:
            call(args.warmup_call_steps, "latent")
        start = timer.start()
        output = call(input_config.num_inference_steps, input_config.output_type)
        total = timer.now() - start
    info = _shared.parallel_info(engine_args, engine_config)
    name = "pixart_alpha" + ("_random_tiny" if args.tiny else "_random" * args.random_weights)
    _shared.report(name, pipe, output, timer, total, args, info)
    get_runtime_state().destroy_distributed_env()


if __name__ == "__main__":
    from tokenring_xdit.tools.rank_exit import run_main

    run_main(main, __file__)  # our errors: one line per rank (LOG_LEVEL=debug: traceback)
