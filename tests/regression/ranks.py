"""Rank functions of the regression tests (spawned by tests.harness.run_ranks, which has already
made the gloo or NCCL process group).

One launch serves every case of a layout (CI has 2 cores): `run_cases` wraps each pipeline with
xDiT once and renders it with xDiT's own ring and with TokenRing (chosen in-process with
`set_xdit_ring_impl`, between two calls of the same wrapped pipeline), then runs the USP-level
cases on the runtime state that pipeline left. Everything returned is plain Python / numpy (a
tensor crosses the result queue as a shared-memory handle that dies with the rank).
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

import numpy as np
import torch

from tokenring_xdit.tools import compare

IMPLS = ("default", "token_ring")
# Uneven local lengths at the USP level: rank r of the ring holds UNEVEN[r % len(UNEVEN)] rows
# (xDiT's pipelines refuse uneven splits, see test_images.py).
UNEVEN = (7, 3, 5, 4)
UNEVEN_JOINT = 5  # joint (text) tokens held by every rank in the uneven joint case
B, H, D = 1, 4, 16


def config_for(config: dict, model: str) -> compare.CompareConfig:
    """The compare command's settings for `model` (its guidance scale and prompt length unless
    given)."""
    size = config.get("size", "tiny")
    defaults = dict(
        guidance=compare.GUIDANCE[model], text_len=compare.DEFAULT_TEXT_LEN[model, size]
    )
    return compare.CompareConfig(**{**defaults, **config, "model": model})


def set_up(rank: int, world_size: int, device: str, argv: list[str]):
    """CPU mode on CPU (before the first `import xfuser`), TokenRing's patches, xDiT's world
    group and an engine config parsed by xDiT's own parser."""
    if device == "cpu":
        from tokenring_xdit.patches import xfuser_cpu

        if "xfuser" in sys.modules:
            raise AssertionError("xfuser was imported before CPU mode was enabled")
        xfuser_cpu.enable()
    import tokenring_xdit

    tokenring_xdit.install()
    from xfuser import xFuserArgs
    from xfuser.config import FlexibleArgumentParser
    from xfuser.core.distributed import init_distributed_environment

    init_distributed_environment(rank=rank, world_size=world_size, local_rank=rank)
    parser = xFuserArgs.add_cli_args(FlexibleArgumentParser(description="regression"))
    engine_config, _ = xFuserArgs.from_cli_args(parser.parse_args(argv)).create_config()
    return engine_config


def _np(x: torch.Tensor) -> np.ndarray:
    return x.detach().float().cpu().numpy().copy()


class RingCalls:
    """Calls into TokenRing's xDiT entry point (with the local query lengths it saw) and into
    xDiT's own torch ring."""

    def __init__(self) -> None:
        import xfuser.model_executor.layers.usp as usp

        import tokenring_xdit.hosts.xdit as xdit_ring

        self.reset()
        xdit_ring.usp_ring_attn = self._wrap(xdit_ring.usp_ring_attn, "token_ring")
        usp._templated_ring_attention = self._wrap(usp._templated_ring_attention, "xdit_ring")

    def _wrap(self, fn, key: str):
        def counted(*args, **kwargs):
            self.counts[key] += 1
            if key == "token_ring":
                self.q_lens.add(int((args[1] if len(args) > 1 else kwargs["query"]).shape[2]))
            return fn(*args, **kwargs)

        counted.__wrapped__ = fn
        return counted

    def reset(self) -> None:
        self.counts = {"token_ring": 0, "xdit_ring": 0}
        self.q_lens: set[int] = set()

    def take(self) -> dict:
        out = dict(self.counts, q_lens=sorted(self.q_lens))
        self.reset()
        return out


def _pipeline_case(rank: int, spec: dict, engine_config, calls: RingCalls, model: str) -> dict:
    """The compare command's pipeline (same builder, seed, latents) under xDiT, once per ring
    implementation: the last rank's image, every rank's part of the final latents."""
    from xfuser import xFuserFluxPipeline, xFuserPixArtAlphaPipeline

    from tokenring_xdit.hosts import selection

    cfg = config_for(spec["config"], model)
    device = f"cuda:{rank}" if cfg.device == "cuda" else "cpu"
    pipe, kwargs = compare.build_pipeline(cfg, device)
    wrapper = {"pixart": xFuserPixArtAlphaPipeline, "flux": xFuserFluxPipeline}[model]
    xpipe = wrapper(pipe, engine_config)
    results: dict[str, Any] = {}
    for impl in IMPLS:
        selection.set_xdit_ring_impl(impl)
        timer = compare.StepTimer(device)
        calls.reset()
        with torch.inference_mode():
            timer.start()
            out = xpipe(**kwargs, **timer.kwargs(model))
        results[impl] = dict(
            image=None if out is None else _np(out.images[0].permute(1, 2, 0)),
            latents=_np(timer.latents),
            calls=calls.take(),
        )
    selection.set_xdit_ring_impl(None)
    return results


def uneven_inputs(world: int, joint: bool) -> dict[str, torch.Tensor]:
    """Global fp64 q/k/v (b, h, s, d): rank r owns UNEVEN[r] rows; plus joint K/V."""
    gen = torch.Generator().manual_seed(99)
    total = sum(UNEVEN[r % len(UNEVEN)] for r in range(world))

    def randn(s: int) -> torch.Tensor:
        # large logits: a wrong merge cannot hide behind nearly uniform attention
        return 3.0 * torch.randn(B, H, s, D, generator=gen, dtype=torch.float64)

    x = {n: randn(total) for n in ("q", "k", "v")}
    if joint:
        x.update({n: randn(UNEVEN_JOINT) for n in ("jk", "jv")})
    return x


def uneven_rows(rank: int, world: int) -> slice:
    start = sum(UNEVEN[r % len(UNEVEN)] for r in range(rank))
    return slice(start, start + UNEVEN[rank % len(UNEVEN)])


def uneven_reference(rank: int, world: int, joint: bool, dtype=torch.float64) -> np.ndarray:
    """Exact fp64 attention of rank `rank`'s query rows against every rank's K/V (+ the joint
    K/V), from the inputs as the ranks held them (rounded to `dtype`)."""
    x = {n: t.to(dtype).double() for n, t in uneven_inputs(world, joint).items()}
    k, v = x["k"], x["v"]
    if joint:
        k, v = torch.cat([k, x["jk"]], dim=2), torch.cat([v, x["jv"]], dim=2)
    q = x["q"][:, :, uneven_rows(rank, world)]
    return torch.nn.functional.scaled_dot_product_attention(q, k, v).numpy()


def _uneven_case(rank: int, world: int, spec: dict, impl: str, joint: bool) -> dict:
    """xfuser's `usp.ring_attn` (the ring step of USP) with a different local length on every
    rank of the ring, with the ring implementation `impl`."""
    import xfuser.model_executor.layers.usp as usp

    from tokenring_xdit.hosts import selection

    dtype = getattr(torch, spec["config"]["dtype"])
    device = f"cuda:{rank}" if spec["config"]["device"] == "cuda" else "cpu"
    x = {n: t.to(device, dtype) for n, t in uneven_inputs(world, joint).items()}
    rows = uneven_rows(rank, world)
    q, k, v = (x[n][:, :, rows].contiguous() for n in ("q", "k", "v"))
    joint_kwargs = None
    if joint:
        joint_kwargs = dict(
            joint_key=x["jk"],
            joint_value=x["jv"],
            joint_strategy="rear",
            step=0,
            total_steps=world,  # USP's own counter: the joint K/V join at the last ring step
        )
    selection.set_xdit_ring_impl(impl)
    try:
        with torch.inference_mode():
            out = usp.ring_attn(
                usp._get_attention_function(), q, k, v, joint_attn_kwargs=joint_kwargs
            )
        return dict(out=_np(out))
    except Exception as exc:
        return dict(error=f"{type(exc).__name__}: {exc}"[:2000], error_type=type(exc).__name__)
    finally:
        selection.set_xdit_ring_impl(None)


def _refused_case(rank: int, spec: dict, engine_config, model: str, height: int, width: int):
    """Render a size whose latent rows do not split evenly over the sequence-parallel ranks;
    xDiT raises before any communication (on every rank alike)."""
    from xfuser import xFuserFluxPipeline, xFuserPixArtAlphaPipeline

    cfg = config_for({**spec["config"], "height": height, "width": width, "steps": 1}, model)
    device = f"cuda:{rank}" if cfg.device == "cuda" else "cpu"
    pipe, kwargs = compare.build_pipeline(cfg, device)
    wrapper = {"pixart": xFuserPixArtAlphaPipeline, "flux": xFuserFluxPipeline}[model]
    try:
        with torch.inference_mode():
            wrapper(pipe, engine_config)(**kwargs)
    except Exception as exc:
        return dict(error_type=type(exc).__name__, error=str(exc)[:500])
    return dict(error_type=None)


def run_cases(rank: int, world_size: int, spec: dict) -> dict:
    """spec: config (CompareConfig fields), argv (xDiT flags), models (pipelines to render),
    refused (sizes xDiT should refuse: (model, height, width)), uneven (USP cases: (impl,
    joint))."""
    cfg = spec["config"]
    engine_config = set_up(rank, world_size, cfg["device"], spec["argv"])
    calls = RingCalls()
    results: dict[str, Any] = dict(rank=rank)
    for model in spec.get("models", ()):
        try:
            results[model] = _pipeline_case(rank, spec, engine_config, calls, model)
        except Exception as exc:
            results[model] = dict(
                error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc()
            )
    for model, height, width in spec.get("refused", ()):
        results[f"refused/{model}/{height}x{width}"] = _refused_case(
            rank, spec, engine_config, model, height, width
        )
    for impl, joint in spec.get("uneven", ()):
        calls.reset()
        case = _uneven_case(rank, world_size, spec, impl, joint)
        case["calls"] = calls.take()
        results[f"uneven/{impl}/{'joint' if joint else 'plain'}"] = case
    return results


def render_single(config: dict, model: str) -> dict:
    """Plain diffusers in this process (no xDiT): image and final latents of the same pipeline,
    seed and starting latents. On CPU with one thread: on a busy 2-core machine (CI running
    other work) two OpenMP threads of these tiny models can be ten times slower than one."""
    cfg = config_for(config, model)
    device = "cuda:0" if cfg.device == "cuda" else "cpu"
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)
    try:
        pipe, kwargs = compare.build_pipeline(cfg, device)
        timer = compare.StepTimer(device)
        with torch.inference_mode():
            timer.start()
            out = pipe(**kwargs, **timer.kwargs(model))
    finally:
        torch.set_num_threads(threads)
    return dict(image=_np(out.images[0].permute(1, 2, 0)), latents=_np(timer.latents))
