"""End to end: xFuserPixArtAlphaPipeline and xFuserFluxPipeline around the tiny random pipelines
of tokenring_xdit.tools.pipelines, on gloo ranks in CPU mode (fp32), TokenRing vs xDiT's own ring vs
plain diffusers in this process; same weights, prompt embeddings and starting latents.

Layouts: ring 2 (world 2) and ulysses 2 x ring 2 (world 4; the tiny models have 4 heads). Each
wrapper runs twice on the same ranks, once per ring implementation (the selection is read at
every ring call). xDiT wraps the self-attention of every block: one ring call per block per step
on every rank (PixArt's CFG batch goes through together).

Flux's joint attention: in xfuser 0.7.0 without PipeFusion, xDiT splits the 16 text tokens over
the SP ranks with the image tokens (`split_text_embed_in_sp`) and each block attends over
text + image together, so the text tokens travel through the ring like image tokens (the test
checks the ring's local query length: (16 image + 16 text) * ulysses / sp). USP's joint_query /
joint_key / joint_value path is taken by Flux only under PipeFusion (which hangs on gloo, see
docs/cpu-mode.md); test_usp.py and test_long_ctx.py cover it directly.

Sensitivity, measured by hand: the same plain-diffusers run with every self-attention limited to
half of its keys moves the latents by 1.4e-1 (PixArt) and 7.0e-2 (Flux), far above the bound.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from tests.xdit import workers
from tests.xdit.launches import (
    CPU_MODE_MARKS,
    LAYOUTS,
    PIPELINE_LAYOUTS,
    cpu_launch,
    max_err,
    part,
)

pytestmark = CPU_MODE_MARKS
# one pytest-xdist worker for every file that reads cpu_launch (tests/xdist_scopes.py)
XDIST_SCOPE = "tests/xdit/launches.py"

LATENT_TOL = 1e-4  # fp32; measured <= 6.2e-6 (PixArt latents up to ~13, Flux up to ~3.7)
IMAGE_TOKENS = 16  # both tiny pipelines: 16 x 16 pixels -> 8 x 8 latents -> 16 tokens


@functools.cache
def _reference(model: str) -> np.ndarray:
    return workers.plain_pipeline_latents(model, "cpu", torch.float32)


def _latents(layout: str, model: str, impl: str) -> np.ndarray:
    results = cpu_launch(layout)
    got = part(results[-1], model)[impl]["latents"]  # only the last rank gets the output
    assert got is not None, f"{layout} {model} {impl}: the last rank returned no latents"
    return got


@pytest.mark.parametrize("model", ["pixart", "flux"])
@pytest.mark.parametrize("layout", PIPELINE_LAYOUTS)
def test_pipeline_matches_diffusers_and_xdit_ring(layout: str, model: str) -> None:
    ref = _reference(model)
    token_ring = _latents(layout, model, workers.TOKEN_RING)
    default = _latents(layout, model, workers.DEFAULT)
    diffs = {
        "TokenRing vs diffusers": max_err(token_ring, ref),
        "xDiT ring vs diffusers": max_err(default, ref),
        "TokenRing vs xDiT ring": max_err(token_ring, default),
    }
    report = ", ".join(f"{k} {v:.2e}" for k, v in diffs.items())
    print(f"{layout} {model} (max |latent| {np.abs(ref).max():.1f}): {report}")
    assert max(diffs.values()) <= LATENT_TOL, f"{layout} {model}: {report} (bound {LATENT_TOL})"


@pytest.mark.parametrize("model", ["pixart", "flux"])
@pytest.mark.parametrize("layout", PIPELINE_LAYOUTS)
def test_token_ring_ran_on_every_rank(layout: str, model: str) -> None:
    """A silent fall-back to xDiT's ring (or the reverse) fails here, on any rank."""
    ulysses, ring = LAYOUTS[layout]
    text = workers.TEXT_LEN if model == "flux" else 0
    ring_q_len = (IMAGE_TOKENS + text) * ulysses // (ulysses * ring)
    for result in cpu_launch(layout):
        got = part(result, model)
        calls = got["expected_ring_calls"]
        assert got["backend"] == "SDPA_FLASH"
        tr = {k: v for k, v in got[workers.TOKEN_RING].items() if k != "latents"}
        assert tr.pop("graph") is None  # no TOKENRING_XDIT_CUDA_GRAPH_TRANSFORMER here
        # USP's K/V cache step only copies without PipeFusion: skipped for TokenRing (its K/V
        # never move) wherever a ring runs; xDiT's ring keeps it (both models pass their layer)
        kv_steps = got[workers.DEFAULT]["kv_cache_steps"]
        assert tr.pop("kv_cache_steps") == (0 if ring > 1 else kv_steps), (result["rank"], tr)
        assert kv_steps == calls, (result["rank"], kv_steps)
        assert tr == dict(
            kernel_calls=ring * calls,
            q_messages=(ring - 1) * calls,
            partial_messages=2 * (ring - 1) * calls,
            usp_ring_attn=calls,
            usp_ring_attn_joint=0,
            templated_ring=0,
            ring_q_lens=[ring_q_len],
        ), (result["rank"], tr)
        default = got[workers.DEFAULT]
        counts = {k: default[k] for k in ("kernel_calls", "usp_ring_attn", "templated_ring")}
        assert counts == dict(kernel_calls=0, usp_ring_attn=0, templated_ring=calls), (
            result["rank"],
            counts,
        )


def test_graph_transformer_env_wraps_xdits_transformer_and_stays_exact_on_cpu() -> None:
    """TOKENRING_XDIT_CUDA_GRAPH_TRANSFORMER=1: xDiT's wrapped transformer gets a graphed forward
    (the xfuser.cuda_graph_transformer patch). On CPU there is nothing to capture: every call
    runs eagerly and the latents are bitwise those of the launch without the variable."""
    from tests.xdit.launches import launch

    spec = dict(
        device="cpu",
        dtype="float32",
        ulysses=1,
        ring=2,
        impls=(workers.TOKEN_RING,),
        parts=("pixart",),
    )
    env = {"TOKENRING_XDIT_CUDA_GRAPH_TRANSFORMER": "1"}
    results = launch(spec, 2, env=env)
    for result in results:
        graph = part(result, "pixart")[workers.TOKEN_RING]["graph"]
        assert graph is not None, "the transformer was not graphed"
        assert graph["captures"] == graph["replays"] == 0 and graph["eager"] == workers.STEPS
    graphed = part(results[-1], "pixart")[workers.TOKEN_RING]["latents"]
    assert np.array_equal(graphed, _latents("ring2", "pixart", workers.TOKEN_RING))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "torch_compile"])
def test_graph_transformer_gate(compiled: bool) -> None:
    """The xfuser.cuda_graph_transformer hook graphs the wrapped transformer, except where
    Python state changes between steps: with xDiT's --use_torch_compile it refuses, says why on
    every rank, and leaves xDiT's compiled forward alone. (Only the wrappers are built here.)"""
    from tests.xdit.launches import launch

    spec = dict(
        device="cpu",
        dtype="float32",
        ulysses=1,
        ring=2,
        impls=(workers.TOKEN_RING,),
        parts=("graph_gate",),
        argv=["--use_torch_compile"] if compiled else [],
    )
    env = {"TOKENRING_XDIT_CUDA_GRAPH_TRANSFORMER": "1"}
    for result in launch(spec, 2, env=env):
        gate = part(result, "graph_gate")
        refusals = [m for m in gate["warnings"] if "stays eager" in m]
        if compiled:
            assert not gate["graphed"] and len(refusals) == 1, gate
            assert "torch.compile" in refusals[0], refusals
        else:
            assert gate["graphed"] and not refusals, gate
