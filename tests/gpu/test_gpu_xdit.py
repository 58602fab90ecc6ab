"""xDiT on 2 GPUs (NCCL, bf16, xfuser's native CUDA path, no CPU mode): TokenRing as xDiT's ring.

python -m pytest -m gpu tests/gpu/test_gpu_xdit.py -q -s

One launch of 2 ranks (ring 2) runs the same rank function as the CPU tests
(tests/xdit/workers.py, device "cuda", dtype bfloat16): xDiT's USP cases against exact attention,
and the tiny random PixArt-alpha and Flux pipelines through xFuserPixArtAlphaPipeline /
xFuserFluxPipeline with TokenRing and with xDiT's own ring; the last rank also runs plain
diffusers on its GPU (the single-GPU reference). xDiT picks its attention backend itself (cuDNN
on H100/H200 in bf16).

TokenRing replays CUDA graphs after the first call of a signature, so its kernel counter only
grows on eager calls; that TokenRing ran is shown by the calls into its xDiT entry point (every
ring call, every rank) with the counter > 0, and xDiT's torch ring never being entered.

Bounds: exact attention outputs are O(1) and bf16 carries 8 bits, so 2e-2 (as
tests/gpu/test_gpu_token_ring.py). Latents are compared relative to their scale: the tiny
PixArt's DDIM latents reach ~13, where one bf16 step is 0.0625, so an absolute bound would
measure bf16's spacing, not the ring.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from tests.harness import run_ranks, values
from tests.xdit import workers

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]

WORLD = 2
BF16_TOL = 2e-2  # |USP - exact| on O(1) attention outputs
LATENT_TOL = 5e-2  # max |a - b| / max(1, max |b|) on latents, TokenRing vs xDiT's ring
DIFFUSERS_TOL = 1e-1  # same measure against single-GPU diffusers (other kernels: SDPA, not cuDNN)
SPEC = dict(
    device="cuda",
    dtype="bfloat16",
    ulysses=1,
    ring=WORLD,
    impls=(workers.TOKEN_RING, workers.DEFAULT),
    parts=("usp", "pixart", "flux"),
    reference=True,
    # the GPU machine may carry the package on PYTHONPATH only (no .pth, no entry points)
    install=True,
)


@functools.cache
def _launch() -> tuple[dict, ...]:
    results = run_ranks(workers.run_xdit, WORLD, SPEC, timeout=600, backend="nccl")
    return tuple(values(results))


def _part(result: dict, name: str) -> dict:
    got = result[name]
    if "error" in got:
        raise AssertionError(f"rank {result['rank']} part {name!r}: {got['error']}\n{got['trace']}")
    return got


def _max_abs(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())


@pytest.mark.parametrize("case", workers.USP_CASES)
def test_usp_bf16_matches_exact(case: str) -> None:
    errors = {}
    for result in _launch():
        usp = _part(result, "usp")
        ref = workers.expected_rows(
            case, usp["sp"], usp["ring"], usp["sp_rank"], usp["ring_rank"], dtype=torch.bfloat16
        )
        for impl in (workers.TOKEN_RING, workers.DEFAULT):
            errors[(result["rank"], impl)] = _max_abs(usp[f"{impl}/{case}"]["out"], ref.numpy())
        tr = usp[f"{workers.TOKEN_RING}/{case}"]
        assert tr["usp_ring_attn"] == 1 and tr["templated_ring"] == 0, (result["rank"], tr)
        assert tr["kernel_calls"] > 0, (result["rank"], tr)  # first call of a signature: eager
        default = usp[f"{workers.DEFAULT}/{case}"]
        assert default["usp_ring_attn"] == 0 and default["templated_ring"] == 1, default
        assert default["kernel_calls"] == 0, default
    report = ", ".join(f"rank {r} {impl} {e:.2e}" for (r, impl), e in errors.items())
    print(f"USP {case} bf16 ({_launch()[0]['backend']}): max |out - exact| {report}")
    assert max(errors.values()) <= BF16_TOL, f"{case}: {report} (bound {BF16_TOL})"


@pytest.mark.parametrize("model", ["pixart", "flux"])
def test_pipeline_bf16_token_ring_vs_xdit_ring_vs_diffusers(model: str) -> None:
    results = _launch()
    for result in results:
        got = _part(result, model)
        calls = got["expected_ring_calls"]
        tr, default = got[workers.TOKEN_RING], got[workers.DEFAULT]
        assert tr["usp_ring_attn"] == calls and tr["templated_ring"] == 0, (result["rank"], tr)
        assert tr["kernel_calls"] > 0, (result["rank"], tr)
        assert default["usp_ring_attn"] == 0 and default["templated_ring"] == calls, default
        assert default["kernel_calls"] == 0, (result["rank"], default)
    last = _part(results[-1], model)
    token_ring, default = last[workers.TOKEN_RING]["latents"], last[workers.DEFAULT]["latents"]
    reference = last["reference"]
    assert token_ring is not None and default is not None and reference is not None
    for name, x in (("TokenRing", token_ring), ("xDiT ring", default), ("diffusers", reference)):
        assert np.isfinite(x).all(), f"{model}: {name} latents are not finite"
    scale = max(1.0, float(np.abs(reference).max()))
    diffs = {
        "TokenRing vs xDiT ring": _max_abs(token_ring, default),
        "TokenRing vs diffusers": _max_abs(token_ring, reference),
        "xDiT ring vs diffusers": _max_abs(default, reference),
    }
    report = ", ".join(f"{k} {v:.3e}" for k, v in diffs.items())
    print(f"{model} bf16 ({last['backend']}, max |latent| {scale:.1f}): {report}")
    assert diffs["TokenRing vs xDiT ring"] <= LATENT_TOL * scale, report
    assert diffs["TokenRing vs diffusers"] <= DIFFUSERS_TOL * scale, report


@functools.cache
def _launch_graphed() -> tuple[dict, ...]:
    """The pipelines again, with TOKENRING_XDIT_CUDA_GRAPH_TRANSFORMER=1. The launch ends with
    destroy_process_group after graphs captured NCCL kernels: a hang there fails it too."""
    spec = dict(SPEC, parts=("pixart", "flux"), reference=False)
    env = {"TOKENRING_XDIT_CUDA_GRAPH_TRANSFORMER": "1"}
    return tuple(
        values(run_ranks(workers.run_xdit, WORLD, spec, timeout=600, backend="nccl", env=env))
    )


@pytest.mark.parametrize("model", ["pixart", "flux"])
def test_graphed_transformer_replays_and_matches_eager(model: str) -> None:
    graphed, eager = _launch_graphed(), _launch()
    for result in graphed:
        stats = _part(result, model)[workers.TOKEN_RING]["graph"]
        assert stats is not None and stats["captures"] == 1, (result["rank"], stats)
        assert stats["replays"] == workers.STEPS - 1 and not stats["refused"], stats
    last_g, last_e = _part(graphed[-1], model), _part(eager[-1], model)
    scale = max(1.0, float(np.abs(last_e[workers.TOKEN_RING]["latents"]).max()))
    diffs = {
        impl: _max_abs(last_g[impl]["latents"], last_e[impl]["latents"])
        for impl in (workers.TOKEN_RING, workers.DEFAULT)
    }
    default_stats = last_g[workers.DEFAULT]["graph"]
    print(
        f"{model} bf16, graphed vs eager transformer: TokenRing {diffs[workers.TOKEN_RING]:.3e}, "
        f"xDiT ring {diffs[workers.DEFAULT]:.3e} (max |latent| {scale:.1f}); xDiT ring graph "
        f"stats {default_stats}"
    )
    assert diffs[workers.TOKEN_RING] <= LATENT_TOL * scale
    assert diffs[workers.DEFAULT] <= LATENT_TOL * scale
