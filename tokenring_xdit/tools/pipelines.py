"""Real diffusers pipelines with seeded random weights: nothing is downloaded.

Sizes: "tiny" (CPU tests, seconds), "full" (the real PixArt-alpha XL-2 1024 / Flux.1-dev
transformer and VAE architectures, for GPU benchmarks and regression). Text encoders are
replaced by seeded prompt embeddings of the real shapes (T5-XXL 4096-d, CLIP pooled 768-d), so
every pipeline is called with `prompt_embeds`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

PIXART_TINY = dict(
    sample_size=8,
    num_layers=2,
    patch_size=2,
    attention_head_dim=8,
    num_attention_heads=4,
    caption_channels=32,
    in_channels=4,
    out_channels=8,
    cross_attention_dim=32,
    use_additional_conditions=False,
)
PIXART_FULL: dict = dict(caption_channels=4096)  # diffusers' defaults are PixArt-alpha XL-2 1024
FLUX_TINY = dict(
    patch_size=1,
    in_channels=16,
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=8,
    num_attention_heads=4,
    joint_attention_dim=32,
    pooled_projection_dim=16,
    guidance_embeds=True,
    axes_dims_rope=(2, 2, 4),
)
FLUX_FULL = dict(guidance_embeds=True)  # diffusers' defaults are Flux.1-dev's 19 + 38 blocks
VAE_TINY = dict(
    block_out_channels=(8, 16),
    down_block_types=("DownEncoderBlock2D",) * 2,
    up_block_types=("UpDecoderBlock2D",) * 2,
    norm_num_groups=8,
    layers_per_block=1,
)
VAE_FULL = dict(
    block_out_channels=(128, 256, 512, 512),
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
    layers_per_block=2,
)


@dataclass
class Built:
    """A diffusers pipeline plus the keyword arguments that stand in for its text encoders."""

    pipe: object
    call_kwargs: dict
    height: int
    width: int


@contextlib.contextmanager
def building(device, dtype):
    """Construct modules on `device` directly in `dtype` (a full Flux built in fp32 first would
    need ~70 GB at its peak)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


def _seeded(seed: int) -> torch.Generator:
    torch.manual_seed(seed)  # module init draws from the global generator
    return torch.Generator().manual_seed(seed)


def pixart(
    size: str = "tiny",
    seed: int = 0,
    dtype=torch.float32,
    device="cpu",
    height: int | None = None,
    width: int | None = None,
    text_len: int = 16,
) -> Built:
    """PixArtAlphaPipeline (tokenizer/text encoder replaced by prompt embeddings)."""
    from diffusers import (
        AutoencoderKL,
        DPMSolverMultistepScheduler,
        PixArtAlphaPipeline,
        PixArtTransformer2DModel,
    )

    gen = _seeded(seed)
    cfg = PIXART_TINY if size == "tiny" else PIXART_FULL
    with building(device, dtype):
        transformer = PixArtTransformer2DModel(**cfg).to(dtype)
        vae = AutoencoderKL(latent_channels=4, **(VAE_TINY if size == "tiny" else VAE_FULL))
    vae = vae.to(dtype)
    pipe = PixArtAlphaPipeline(
        tokenizer=None,
        text_encoder=None,
        transformer=transformer,
        vae=vae,
        scheduler=DPMSolverMultistepScheduler(),
    )
    scale = pipe.vae_scale_factor
    height = height or transformer.config.sample_size * scale
    width = width or transformer.config.sample_size * scale
    dim = transformer.config.caption_channels
    embeds = torch.randn(1, text_len, dim, generator=gen).to(device, dtype)
    negative = torch.randn(1, text_len, dim, generator=gen).to(device, dtype)
    mask = torch.ones(1, text_len, dtype=torch.long, device=device)
    kwargs = dict(
        prompt=None,
        negative_prompt=None,
        prompt_embeds=embeds,
        prompt_attention_mask=mask,
        negative_prompt_embeds=negative,
        negative_prompt_attention_mask=mask.clone(),
        use_resolution_binning=False,
    )
    return Built(pipe, kwargs, height, width)


def flux(
    size: str = "tiny",
    seed: int = 0,
    dtype=torch.float32,
    device="cpu",
    height: int | None = None,
    width: int | None = None,
    text_len: int = 16,
) -> Built:
    """FluxPipeline (T5/CLIP replaced by prompt embeddings and pooled embeddings)."""
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        FluxPipeline,
        FluxTransformer2DModel,
    )

    gen = _seeded(seed)
    cfg = FLUX_TINY if size == "tiny" else FLUX_FULL
    latent = cfg.get("in_channels", 64) // 4
    vae_cfg = VAE_TINY if size == "tiny" else VAE_FULL
    with building(device, dtype):
        transformer = FluxTransformer2DModel(**cfg).to(dtype)
        vae = AutoencoderKL(
            latent_channels=latent,
            use_quant_conv=False,
            use_post_quant_conv=False,
            scaling_factor=0.3611,
            shift_factor=0.1159,
            **vae_cfg,
        )
    vae = vae.to(dtype)
    pipe = FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        text_encoder_2=None,
        tokenizer_2=None,
        transformer=transformer,
    )
    step = pipe.vae_scale_factor * 2  # latents are packed 2x2
    height, width = height or 4 * step, width or 4 * step
    conf = transformer.config
    kwargs = dict(
        prompt=None,
        prompt_embeds=torch.randn(1, text_len, conf.joint_attention_dim, generator=gen).to(
            device, dtype
        ),
        pooled_prompt_embeds=torch.randn(1, conf.pooled_projection_dim, generator=gen).to(
            device, dtype
        ),
    )
    return Built(pipe, kwargs, height, width)


BUILDERS = {"pixart": pixart, "flux": flux}
