"""Negative controls: the thresholds of test_images.py and of `tokenring-xdit compare` catch the
errors a broken ring makes (one process, plain diffusers, CPU, fp32; a few seconds).

Every self-attention of the pipeline is replaced by what a 2-rank ring gets wrong:

- "lost_block": a ring that never receives the other rank's K/V block (half the keys missing);
- "no_lse_merge": both blocks computed, but the two partial outputs averaged instead of weighted
  by their log-sum-exp (the merge a ring without a real lse does; see docs/cpu-mode.md);
- "no_lse_merge_unsharpened": the same with --qk-gain 1, the plain random model, whose nearly
  uniform attention hides it: why compare sharpens the attention by default.

Cross-attention (PixArt's text) is left alone: it never goes through a ring.
"""

from __future__ import annotations

import functools

import pytest
import torch

from tests.regression import ranks
from tokenring_xdit.tools import compare

CONFIG = dict(device="cpu", dtype="float32", steps=8, height=128, width=128, warmup_steps=0)
THRESHOLDS = compare.Thresholds(*compare.DEFAULT_THRESHOLDS["float32"])
REAL_SDPA = torch.nn.functional.scaled_dot_product_attention


def _qkv(args, kwargs):
    args = list(args)
    names = ("query", "key", "value")
    qkv = [args[i] if i < len(args) else kwargs.pop(n) for i, n in enumerate(names)]
    return qkv, args[3:], kwargs


def _broken(kind: str):
    def sdpa(*args, **kwargs):
        (q, k, v), rest, kwargs = _qkv(args, kwargs)
        if q.shape[-2] != k.shape[-2]:  # cross-attention: not a ring's business
            return REAL_SDPA(q, k, v, *rest, **kwargs)
        half = k.shape[-2] // 2
        blocks = [(k[..., :half, :], v[..., :half, :]), (k[..., half:, :], v[..., half:, :])]
        if kind == "lost_block":
            return REAL_SDPA(q, *blocks[0], *rest, **kwargs)
        outs = [REAL_SDPA(q, kb, vb, *rest, **kwargs) for kb, vb in blocks]
        return (outs[0] + outs[1]) / 2

    return sdpa


@functools.cache
def _render(model: str, kind: str | None, qk_gain: float) -> dict:
    config = dict(CONFIG, qk_gain=qk_gain)
    if kind is None:
        return ranks.render_single(config, model)
    torch.nn.functional.scaled_dot_product_attention = _broken(kind)
    try:
        return ranks.render_single(config, model)
    finally:
        torch.nn.functional.scaled_dot_product_attention = REAL_SDPA


def _metrics(model: str, kind: str, qk_gain: float = compare.DEFAULT_QK_GAIN) -> dict:
    from tokenring_xdit.tools.images import image_metrics

    good, bad = _render(model, None, qk_gain), _render(model, kind, qk_gain)
    m = image_metrics(bad["image"], good["image"])
    m["latent_rel_diff"] = compare.latent_rel_diff(bad["latents"], good["latents"])
    print(
        f"{model} {kind} (qk gain {qk_gain:g}): PSNR {m['psnr_db']:.1f} dB, max |diff| "
        f"{m['max_abs_diff']:.2e}, latent rel. {m['latent_rel_diff']:.2e}"
    )
    return m


@pytest.mark.parametrize("kind", ["lost_block", "no_lse_merge"])
@pytest.mark.parametrize("model", ["pixart", "flux"])
def test_a_broken_ring_fails_the_thresholds(model: str, kind: str) -> None:
    m = _metrics(model, kind)
    failures = THRESHOLDS.failures(m)
    assert failures, m
    # the final latents see it with a wide margin (fp32 noise of a correct ring: ~1e-6)
    assert m["latent_rel_diff"] > 100 * THRESHOLDS.latent_rtol, m


@pytest.mark.parametrize("model", ["pixart", "flux"])
def test_sharpened_attention_shows_a_bad_merge_more(model: str) -> None:
    """With --qk-gain 1 the random model's attention is nearly uniform and averaging two equal
    blocks is almost right; the default gain makes the same bug at least 10x larger."""
    plain = _metrics(model, "no_lse_merge", qk_gain=1.0)
    sharp = _metrics(model, "no_lse_merge")
    assert sharp["latent_rel_diff"] > 10 * plain["latent_rel_diff"]


def test_sharpen_attention_scales_the_logits() -> None:
    """q and k each scaled by sqrt(gain): through to_q/to_k (PixArt), through the q/k RMSNorm
    weights (Flux); cross-attention untouched."""
    from tokenring_xdit.tools import pipelines

    pixart = pipelines.pixart("tiny").pipe.transformer
    before = {n: p.clone() for n, p in pixart.named_parameters()}
    assert compare.sharpen_attention(pixart, 16.0) == 2  # the self-attention of 2 blocks
    for name, p in pixart.named_parameters():
        scaled = ".attn1.to_q." in name or ".attn1.to_k." in name
        torch.testing.assert_close(p, before[name] * (4.0 if scaled else 1.0))
    flux = pipelines.flux("tiny").pipe.transformer
    before = {n: p.clone() for n, p in flux.named_parameters()}
    assert compare.sharpen_attention(flux, 16.0) == 2  # one dual block, one single block
    for name, p in flux.named_parameters():
        scaled = any(f".attn.{n}." in name for n in ("norm_q", "norm_k", "norm_added_q"))
        scaled = scaled or ".attn.norm_added_k." in name
        torch.testing.assert_close(p, before[name] * (4.0 if scaled else 1.0))
    assert compare.sharpen_attention(flux, 1.0) == 0
