"""compare's CPU estimate: the parameter counts and shapes it uses are those of the pipelines
it builds (meta tensors: nothing allocated)."""

from __future__ import annotations

import pytest

from tokenring_xdit.tools.compare.config import CompareConfig
from tokenring_xdit.tools.compare.estimate import GIB, SHAPES, estimate


@pytest.mark.parametrize("model, size", sorted(SHAPES))
def test_shapes_are_the_built_pipelines(model, size):
    from tokenring_xdit.tools import pipelines

    pipe = pipelines.BUILDERS[model](size, device="meta").pipe
    conf = pipe.transformer.config
    shape = SHAPES[(model, size)]
    assert shape.params == sum(p.numel() for p in pipe.transformer.parameters())
    assert shape.vae_params == sum(p.numel() for p in pipe.vae.parameters())
    assert shape.width == conf.num_attention_heads * conf.attention_head_dim
    layers = conf.num_layers + getattr(conf, "num_single_layers", 0)
    assert shape.layers == layers
    patch = 2 if model == "flux" else conf.patch_size  # Flux packs 2x2 latents into a token
    assert shape.pixels_per_token == pipe.vae_scale_factor * patch


def test_flux_full_weights_are_48_gb_per_fp32_process():
    cfg = CompareConfig(model="flux", size="full", height=1024, width=1024, text_len=512)
    cost = estimate(cfg, flops_per_s=1e11)
    assert 44 * GIB < cost.weight_bytes < 45 * GIB
    assert cost.ranks == 2 and cost.seconds == pytest.approx(cost.flops / 1e11)
