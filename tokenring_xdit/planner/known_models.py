"""Attention shapes of known DiT models (diffusers configs) and their default step counts."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModelSpec", "MODELS", "tokens_for"]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    heads: int
    head_dim: int
    layers: int  # attention calls per transformer forward
    steps: int  # default denoising steps
    batch: int = 1  # 2 when classifier-free guidance runs both branches in one batch
    text_tokens: int = 0  # joint text tokens in the same attention (Flux, SD3)
    patch_px: int = 16  # image pixels per token side (VAE x8, patch 2)


MODELS = {
    # FluxTransformer2DModel: 24 x 128, 19 double + 38 single blocks; dev: 28 steps, no CFG
    "flux": ModelSpec("flux", 24, 128, 57, 28, 1, 512),
    # PixArtTransformer2DModel (alpha XL-2): 16 x 72, 28 blocks; 20 steps with CFG
    "pixart": ModelSpec("pixart", 16, 72, 28, 20, 2, 0),
    # SD3Transformer2DModel (medium): 24 x 64, 24 joint blocks; 28 steps with CFG, 333 text
    "sd3": ModelSpec("sd3", 24, 64, 24, 28, 2, 333),
    # WanTransformer3DModel 14B: 40 x 128, 40 blocks; 50 steps with CFG (video: pass --tokens)
    "wan": ModelSpec("wan", 40, 128, 40, 50, 2, 0),
}


def tokens_for(spec: ModelSpec, resolution: int) -> int:
    """Attention sequence length of a square image: image tokens plus joint text tokens."""
    side = resolution // spec.patch_px
    return side * side + spec.text_tokens
