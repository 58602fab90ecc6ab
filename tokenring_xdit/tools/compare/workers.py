"""compare's pipeline and per-rank workers (module level: spawn pickles them by reference)."""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable
from typing import Any

from .config import CP_BACKEND, CompareConfig

# ------------------------------------------------------------------------------------------
# The pipeline, identical in every process


def sharpen_attention(transformer, gain: float) -> int:
    """Multiply the logits of every self-attention of `transformer` by `gain`; returns the
    number of attention modules changed.

    q and k are each scaled by sqrt(gain): through their RMSNorm weights where the model
    normalises q/k (Flux), else through the to_q/to_k projections (PixArt). Joint (text)
    projections of Flux's dual blocks are scaled the same way. Cross-attention is left alone
    (it never goes through a ring).
    """
    import torch

    if gain == 1.0:
        return 0
    factor = math.sqrt(gain)
    changed = 0
    with torch.no_grad():
        for module in transformer.modules():
            if not (hasattr(module, "to_q") and hasattr(module, "to_k")):
                continue
            if getattr(module, "is_cross_attention", False):
                continue
            pairs = (("to_q", "to_k", "norm_q", "norm_k"),)
            pairs += (("add_q_proj", "add_k_proj", "norm_added_q", "norm_added_k"),)
            for q_proj, k_proj, q_norm, k_norm in pairs:
                if getattr(module, q_proj, None) is None:
                    continue
                norm = getattr(module, q_norm, None)
                if norm is not None and getattr(norm, "weight", None) is not None:
                    targets = [norm, getattr(module, k_norm)]
                else:
                    targets = [getattr(module, q_proj), getattr(module, k_proj)]
                for target in targets:
                    target.weight.mul_(factor)
                    if getattr(target, "bias", None) is not None:
                        target.bias.mul_(factor)
            changed += 1
    return changed


def initial_latents(cfg: CompareConfig, pipe):
    """The starting noise, drawn on the CPU from the seed (the same on every device)."""
    import torch

    gen = torch.Generator().manual_seed(cfg.seed + 1)
    scale = pipe.vae_scale_factor
    if cfg.model == "pixart":
        shape = (1, pipe.transformer.config.in_channels, cfg.height // scale, cfg.width // scale)
    else:  # Flux: 2x2 patches packed into tokens
        tokens = (cfg.height // scale // 2) * (cfg.width // scale // 2)
        shape = (1, tokens, pipe.transformer.config.in_channels)
    return torch.randn(shape, generator=gen)


def build_pipeline(cfg: CompareConfig, device: str):
    """(diffusers pipeline on `device`, call kwargs): weights, prompt embeddings and latents
    from the seed, output_type "pt" (images in [0, 1])."""
    import torch

    from .. import pipelines

    dtype = getattr(torch, cfg.dtype)
    built = pipelines.BUILDERS[cfg.model](
        cfg.size,
        seed=cfg.seed,
        dtype=dtype,
        device=device,
        height=cfg.height,
        width=cfg.width,
        text_len=cfg.text_len,
    )
    pipe = built.pipe
    sharpen_attention(pipe.transformer, cfg.qk_gain)
    pipe.set_progress_bar_config(disable=True)
    kwargs = dict(
        built.call_kwargs,
        height=cfg.height,
        width=cfg.width,
        num_inference_steps=cfg.steps,
        guidance_scale=cfg.guidance,
        latents=initial_latents(cfg, pipe).to(device, dtype),
        output_type="pt",
    )
    if cfg.model == "flux":
        kwargs["max_sequence_length"] = cfg.text_len
    return pipe.to(device), kwargs


class StepTimer:
    """Per-step wall time through the pipelines' step callbacks (synchronising CUDA first);
    keeps the latents of the last step and reports progress."""

    def __init__(self, device: str, report: Callable[..., None] | None = None):
        self.cuda = device.startswith("cuda")
        self.report = report
        self.step_s: list[float] = []
        self.latents = None
        self._last = 0.0

    def _now(self) -> float:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        return time.perf_counter()

    def start(self) -> float:
        self.step_s, self.latents = [], None
        self._last = self._now()
        return self._last

    def _mark(self, latents) -> None:
        now = self._now()
        self.step_s.append(now - self._last)
        self._last = now
        self.latents = latents
        if self.report is not None:
            self.report(advance=1)

    def kwargs(self, model: str) -> dict:
        """Callback arguments for a pipeline call: PixArt's `callback`, Flux's
        `callback_on_step_end` (both are called after each scheduler step, on every rank)."""
        if model == "pixart":
            return dict(callback=lambda step, t, latents: self._mark(latents), callback_steps=1)

        def on_step_end(pipe, step, t, tensors):
            self._mark(tensors["latents"])
            return tensors

        return dict(callback_on_step_end=on_step_end)


def _timed_call(pipe, kwargs: dict, cfg: CompareConfig, timer: StepTimer, report) -> dict:
    """Warm-up call, then the timed call; returns timings, the image and the final latents."""
    import torch

    with torch.inference_mode():
        # each phase counts its own steps: "warm-up 1/2", then "denoising 3/8"
        if cfg.warmup_steps:
            report(description="warm-up", total=cfg.warmup_steps, completed=0)
            pipe(**dict(kwargs, num_inference_steps=cfg.warmup_steps), **timer.kwargs(cfg.model))
        report(description="denoising", total=cfg.steps, completed=0)
        start = timer.start()
        out = pipe(**kwargs, **timer.kwargs(cfg.model))
        total = timer._now() - start
    # xDiT: only the last rank gets the image; the latents of the last step are each rank's
    # own part of the sequence (PixArt: rows of the latent image; Flux: packed tokens)
    result: dict[str, Any] = dict(
        step_s=list(timer.step_s), total_s=total, image=None, latents=_np(timer.latents)
    )
    if out is not None:
        result["image"] = _np(out.images[0].permute(1, 2, 0))
    return result


def _np(x):
    # numpy, not a tensor: a tensor crosses the result queue as a shared-memory handle that
    # dies with the rank process
    return x.detach().float().cpu().numpy().copy()


def _environment() -> dict:
    import torch

    env = dict(threads_per_rank=torch.get_num_threads())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        env["gpu"] = torch.cuda.get_device_name()
    return env


# ------------------------------------------------------------------------------------------
# Workers (module level: spawn pickles them by reference)


def single_worker(rank: int, nproc: int, report, cfg: CompareConfig) -> dict:
    """Plain diffusers, one process, no xDiT."""
    device = "cuda:0" if cfg.device == "cuda" else "cpu"
    report(description="building the pipeline", total=None, completed=0)
    pipe, kwargs = build_pipeline(cfg, device)
    result = _timed_call(pipe, kwargs, cfg, StepTimer(device, report), report)
    return dict(result, rank=rank, ranks=1, ring_calls={}, **_environment())


def xdit_worker(rank: int, nproc: int, report, cfg: CompareConfig, impl: str) -> dict:
    """xDiT's pipeline wrapper on `nproc` ranks, ring implementation `impl` chosen with
    xDiT's own --ring_impl_type flag (parsed by xFuserArgs, as in xDiT's example scripts)."""
    report(description="importing xDiT", total=None, completed=0)
    if cfg.device == "cpu":
        from ...patches import xfuser_cpu

        xfuser_cpu.enable()  # before the first `import xfuser`
    import tokenring_xdit

    tokenring_xdit.install()  # also done by the .pth unless TOKENRING_XDIT_AUTOPATCH=0
    import torch
    from xfuser import xFuserArgs, xFuserFluxPipeline, xFuserPixArtAlphaPipeline
    from xfuser.config import FlexibleArgumentParser
    from xfuser.core.distributed import get_runtime_state, init_distributed_environment

    # launch() already made the process group; xDiT then only builds its world group
    init_distributed_environment(rank=rank, world_size=nproc, local_rank=rank)
    parser = xFuserArgs.add_cli_args(FlexibleArgumentParser(description="xFuser Arguments"))
    argv = ["--model", f"random-{cfg.name}", "--ring_impl_type", impl]
    argv += ["--ulysses_degree", str(cfg.ulysses), "--ring_degree", str(cfg.ring)]
    argv += ["--height", str(cfg.height), "--width", str(cfg.width), "--seed", str(cfg.seed)]
    argv += ["--num_inference_steps", str(cfg.steps), "--guidance_scale", str(cfg.guidance)]
    argv += ["--output_type", "pt", "--no_use_resolution_binning"]
    argv += ["--max_sequence_length", str(cfg.text_len)]
    engine_config, _ = xFuserArgs.from_cli_args(parser.parse_args(argv)).create_config()
    engine_config.runtime_config.dtype = getattr(torch, cfg.dtype)
    device = f"cuda:{rank}" if cfg.device == "cuda" else "cpu"
    report(description="building the pipeline")
    pipe, kwargs = build_pipeline(cfg, device)
    wrapper = {"pixart": xFuserPixArtAlphaPipeline, "flux": xFuserFluxPipeline}[cfg.model]
    xpipe = wrapper(pipe, engine_config)
    backend = get_runtime_state().attention_backend.name  # chosen as the wrapper was built
    return _ring_run(xpipe, kwargs, cfg, rank, nproc, report, _count_xdit_ring_calls(), backend)


def diffusers_worker(rank: int, nproc: int, report, cfg: CompareConfig, impl: str) -> dict:
    """diffusers' own context parallelism on `nproc` ranks:
    `transformer.enable_parallelism(ContextParallelConfig(ring_degree, ulysses_degree))`, with
    TokenRing selected ("token_ring") or not ("default": diffusers' ring) by
    set_xdit_ring_impl before enable_parallelism (TokenRing's communicators are made there)."""
    report(description="importing diffusers", total=None, completed=0)
    if cfg.device == "cpu":
        from ...patches import diffusers_cpu

        diffusers_cpu.enable()  # gloo, no accelerator, a CPU kernel that returns an lse
    import tokenring_xdit

    tokenring_xdit.install()  # also done by the .pth unless TOKENRING_XDIT_AUTOPATCH=0
    from diffusers import ContextParallelConfig

    from ...hosts import selection

    # explicit for both runs: an inherited TOKENRING_XDIT_RING_IMPL must not pick the ring
    selection.set_xdit_ring_impl(impl)
    device = f"cuda:{rank}" if cfg.device == "cuda" else "cpu"
    report(description="building the pipeline")
    pipe, kwargs = build_pipeline(cfg, device)
    backend = CP_BACKEND[cfg.device]
    pipe.transformer.set_attention_backend(backend)
    pipe.transformer.enable_parallelism(
        config=ContextParallelConfig(ring_degree=cfg.ring, ulysses_degree=cfg.ulysses)
    )
    own_ring = _count_diffusers_ring_calls()
    return _ring_run(pipe, kwargs, cfg, rank, nproc, report, own_ring, backend)


def _ring_run(pipe, kwargs, cfg, rank, nproc, report, own_ring: dict, backend: str) -> dict:
    """A ring run's value: _timed_call on every rank (the last one reports progress), the ring
    calls it made (`own_ring` counts the host's ring, calls_by_host TokenRing's), the ring
    selected."""
    from ...hosts import selection
    from ...hosts.calls import calls_by_host

    before = calls_by_host().get(cfg.host, 0)
    last = rank == nproc - 1
    device = f"cuda:{rank}" if cfg.device == "cuda" else "cpu"
    timer = StepTimer(device, report if last else None)
    result = _timed_call(pipe, kwargs, cfg, timer, report if last else _quiet)
    if cfg.host == "diffusers" and not last:
        # CP gathers the transformer's output on every rank: the last rank returns the whole
        # latents and image (as under xDiT), the others only their timings
        result.update(image=None, latents=None)
    token_ring = calls_by_host().get(cfg.host, 0) - before
    return dict(
        result,
        rank=rank,
        ranks=nproc,
        ring_calls=dict(token_ring=token_ring, **own_ring),
        ring_impl=list(selection.xdit_ring_impl()),
        attention_backend=backend,
        **_environment(),
    )


def _quiet(**fields) -> None:
    return None


def _count_diffusers_ring_calls() -> dict[str, int]:
    """Count calls into diffusers' own ring: `TemplatedRingAttention.apply`, which its templated
    CP attention looks up at call time for the ring (ring_degree > 1) and for ulysses x ring.
    TokenRing's own calls are counted by tokenring_xdit.calls_by_host()."""
    import diffusers.models.attention_dispatch as attention_dispatch

    calls = {"diffusers_ring": 0}
    original = attention_dispatch.TemplatedRingAttention

    class CountedRing(original):  # an autograd.Function: subclassed, its forward is inherited
        @classmethod
        def apply(cls, *args, **kwargs):
            calls["diffusers_ring"] += 1
            return super().apply(*args, **kwargs)

    attention_dispatch.TemplatedRingAttention = CountedRing
    return calls


def _count_xdit_ring_calls() -> dict[str, int]:
    """Count calls into xDiT's own ring (torch's templated ring under `usp.ring_attn`, a module
    global looked up at call time); TokenRing's come from tokenring_xdit.calls_by_host()."""
    import xfuser.model_executor.layers.usp as usp

    calls = {"xdit_ring": 0}
    templated = usp._templated_ring_attention

    def counted(*args, **kwargs):
        calls["xdit_ring"] += 1
        return templated(*args, **kwargs)

    counted.__wrapped__ = templated
    usp._templated_ring_attention = counted
    return calls


# ------------------------------------------------------------------------------------------
# Orchestration


def host_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for dist_name in (
        "tokenring-xdit",
        "torch",
        "xfuser",
        "yunchang",
        "diffusers",
        "numpy",
        "scikit-image",
        "pillow",
    ):
        try:
            found[dist_name] = version(dist_name)
        except PackageNotFoundError:
            found[dist_name] = None
    return found
