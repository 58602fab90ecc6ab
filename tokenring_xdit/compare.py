"""`tokenring-xdit compare`: one image made three ways, compared pixel by pixel.

1. "single": plain diffusers in one process (no xDiT, no ring);
2. "ring": xDiT (xfuser 0.7.0) on N ranks with its own ring (`--ring_impl_type default`);
3. "token_ring": the same xDiT launch with TokenRing (`--ring_impl_type token_ring`).

Each run is its own launch (tokenring_xdit.launch: gloo on CPU with xDiT's CPU mode, NCCL with
one GPU per rank) and builds the same pipeline from tokenring_xdit.pipelines: real PixArt-alpha /
Flux.1 architectures with seeded random weights ("tiny" or "full" size), prompt embeddings in
place of the text encoders, the same seeded starting latents. Nothing is downloaded.

The images are compared as floats in [0, 1] (PSNR, SSIM, max |diff|, scikit-image) and so are
the final latents (max |diff| relative to their largest value). The run fails (exit 1) when
TokenRing vs xDiT's ring or TokenRing vs the single process misses a threshold, or when a run
did not take the ring path it claims (calls into TokenRing and into xDiT's ring are counted).

Random weights give almost uniform attention (logits near 0): then a ring that loses or repeats
key blocks, or merges them with wrong weights, still produces nearly the right output. So by
default every self-attention's logits are multiplied by --qk-gain (16), by scaling its q and k
projections (or, with q/k RMSNorm as in Flux, the norms' weights) by sqrt(gain): each query then
attends to a few keys. --qk-gain 1 runs the plain random model.

Importing this module is cheap (the CLI imports it to build its parser): torch, rich, xfuser
and the image libraries load inside the functions that need them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "CompareConfig",
    "StepTimer",
    "Thresholds",
    "add_arguments",
    "build_pipeline",
    "initial_latents",
    "latent_rel_diff",
    "resolve",
    "run_cli",
    "run_compare",
    "sharpen_attention",
    "single_worker",
    "thresholds_for",
    "xdit_worker",
]

MODELS = ("pixart", "flux")
SIZES = ("tiny", "full")
RUNS = ("single", "ring", "token_ring")
LABELS = {"single": "diffusers, 1 process", "ring": "xDiT ring", "token_ring": "xDiT + TokenRing"}
SHORT = {"single": "single", "ring": "ring", "token_ring": "TokenRing"}
RING_IMPL = {"ring": "default", "token_ring": "token_ring"}  # xDiT's --ring_impl_type
MODEL_NAMES = {"pixart": "PixArt-alpha", "flux": "Flux.1"}
GUIDANCE = {"pixart": 4.5, "flux": 3.5}
DEFAULT_PIXELS = {"tiny": 128, "full": 1024}
DEFAULT_STEPS = {"tiny": 8, "full": 20}
# prompt tokens: PixArt-alpha's T5 takes 120, Flux.1-dev's 512
DEFAULT_TEXT_LEN = {
    ("pixart", "tiny"): 16,
    ("flux", "tiny"): 16,
    ("pixart", "full"): 120,
    ("flux", "full"): 512,
}
DEFAULT_QK_GAIN = 16.0
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
# (image PSNR floor in dB, image max |diff| ceiling, latent max |diff| / max |latent| ceiling)
DEFAULT_THRESHOLDS = {
    "float32": (60.0, 1.0 / 255.0, 1e-4),
    "bfloat16": (35.0, math.inf, math.inf),
    "float16": (35.0, math.inf, math.inf),
}
# Pairs (test, reference): the first two decide; the last is shown for context.
CHECKED = (("token_ring", "ring"), ("token_ring", "single"))
SHOWN = (*CHECKED, ("ring", "single"))

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_WORKER = 0, 1, 2, 3


@dataclass(frozen=True)
class CompareConfig:
    """Resolved settings (no "auto" left), identical in every run."""

    model: str = "pixart"
    size: str = "tiny"
    device: str = "cpu"
    dtype: str = "float32"
    nproc: int = 2
    ulysses: int = 1
    ring: int = 2
    steps: int = 8
    height: int = 128
    width: int = 128
    seed: int = 0
    guidance: float = 4.5
    text_len: int = 16
    qk_gain: float = DEFAULT_QK_GAIN
    warmup_steps: int = 2

    @property
    def name(self) -> str:
        return f"{self.model}-{self.size}"


@dataclass(frozen=True)
class Thresholds:
    psnr_min: float
    max_diff: float
    latent_rtol: float

    def failures(self, m: dict) -> list[str]:
        """What a comparison (image_metrics + latent_rel_diff) misses; [] when it passes."""
        bad = []
        if not m["psnr_db"] >= self.psnr_min:
            bad.append(f"PSNR {m['psnr_db']:.1f} dB < {self.psnr_min:g} dB")
        if not m["max_abs_diff"] <= self.max_diff:
            bad.append(f"max |diff| {m['max_abs_diff']:.3g} > {self.max_diff:.3g}")
        if not m["latent_rel_diff"] <= self.latent_rtol:
            bad.append(f"latent rel. diff {m['latent_rel_diff']:.3g} > {self.latent_rtol:.3g}")
        return bad


# ------------------------------------------------------------------------------------------
# Arguments


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _gain(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", choices=MODELS, default="pixart", help="pipeline (default pixart)")
    p.add_argument(
        "--size",
        choices=SIZES,
        default="tiny",
        help="tiny: a 2-layer model, seconds on CPU; full: the real PixArt-alpha XL-2 1024 / "
        "Flux.1-dev architecture (GPU). Weights are seeded random either way (default tiny)",
    )
    p.add_argument(
        "--nproc",
        type=_positive,
        default=None,
        help="ranks of the xDiT runs (default: ulysses x ring if given, else the GPU count "
        "with CUDA, at least 2; 2 on CPU)",
    )
    p.add_argument("--ulysses-degree", type=_positive, default=1, help="xDiT ulysses degree (1)")
    p.add_argument(
        "--ring-degree",
        type=_positive,
        default=None,
        help="xDiT ring degree, at least 2 (default: nproc / ulysses)",
    )
    p.add_argument(
        "--steps",
        type=_positive,
        default=None,
        help=f"denoising steps (default {DEFAULT_STEPS['tiny']} tiny, {DEFAULT_STEPS['full']} "
        "full)",
    )
    p.add_argument(
        "--height",
        type=_positive,
        default=None,
        help=f"pixels (default {DEFAULT_PIXELS['tiny']} tiny, {DEFAULT_PIXELS['full']} full)",
    )
    p.add_argument("--width", type=_positive, default=None, help="pixels (default: as height)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights, prompt and latents (0)")
    p.add_argument(
        "--out", metavar="DIR", default="tokenring-compare", help="output folder (created)"
    )
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto = one GPU per rank when enough GPUs exist, else CPU (default auto)",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default="auto",
        help="auto = float32 on CPU, bfloat16 on GPU",
    )
    p.add_argument(
        "--psnr-min",
        type=float,
        default=None,
        help="image PSNR floor in dB (default 60 for float32, 35 for bf16/fp16)",
    )
    p.add_argument(
        "--max-diff",
        type=float,
        default=None,
        help="image max |diff| ceiling, pixels in [0, 1] (default 1/255 for float32, "
        "unchecked (inf) for bf16/fp16)",
    )
    p.add_argument(
        "--latent-rtol",
        type=float,
        default=None,
        help="final latents' max |diff| / max |latent| ceiling (default 1e-4 for float32, "
        "unchecked (inf) for bf16/fp16)",
    )
    p.add_argument(
        "--qk-gain",
        type=_gain,
        default=DEFAULT_QK_GAIN,
        help="multiply every self-attention's logits by this (random weights give nearly "
        f"uniform attention, which hides ring errors); 1 = the plain random model "
        f"(default {DEFAULT_QK_GAIN:g})",
    )
    p.add_argument(
        "--text-len",
        type=_positive,
        default=None,
        help="prompt tokens (seeded random embeddings; default 16 tiny, 120 PixArt full, "
        "512 Flux full); for Flux a multiple of ulysses x ring",
    )
    p.add_argument("--guidance", type=float, default=None, help="guidance scale (4.5 / 3.5)")
    p.add_argument(
        "--warmup-steps",
        type=int,
        default=2,
        help="an untimed call of this many steps before the timed one (0: none; default 2)",
    )
    p.add_argument(
        "--gain",
        type=_gain,
        default=None,
        help="amplification of the difference maps (default: the power of ten that shows "
        "the largest difference)",
    )
    p.add_argument(
        "--timeout", type=float, default=900.0, help="seconds per run before it is killed (900)"
    )
    p.add_argument("--no-progress", action="store_true", help="no live progress display")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="keep the ranks' own logging (xDiT, diffusers, warnings); default: errors only",
    )


def resolve(args: argparse.Namespace, gpus: int | None = None) -> CompareConfig:
    """Fill in the defaults; ValueError on a bad combination. `gpus` = None: ask torch."""
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    ulysses = args.ulysses_degree
    if args.nproc is not None:
        nproc = args.nproc
    elif args.ring_degree is not None:
        nproc = ulysses * args.ring_degree
    elif args.device != "cpu" and gpus >= 2:
        nproc = gpus
    else:
        nproc = 2 * ulysses
    if nproc % ulysses:
        raise ValueError(f"--nproc {nproc} is not a multiple of --ulysses-degree {ulysses}")
    ring = args.ring_degree if args.ring_degree is not None else nproc // ulysses
    if ulysses * ring != nproc:
        raise ValueError(
            f"--ulysses-degree {ulysses} x --ring-degree {ring} must equal --nproc {nproc}"
        )
    if ring < 2:
        raise ValueError("--ring-degree must be at least 2: with 1 there is no ring to compare")
    device = args.device
    if device == "auto":
        device = "cuda" if gpus >= nproc else "cpu"
    if device == "cuda" and gpus < nproc:
        raise ValueError(f"--device cuda needs one GPU per rank: {nproc} ranks, {gpus} GPU(s)")
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")
    if device == "cpu" and dtype != "float32":
        raise ValueError("on CPU use --dtype float32 (xDiT's CPU kernel is float32)")
    size = args.size
    height = args.height or args.width or DEFAULT_PIXELS[size]
    width = args.width or height
    _check_pixels(args.model, size, height, width, nproc)
    text_len = args.text_len or DEFAULT_TEXT_LEN[(args.model, size)]
    if args.model == "flux" and text_len % nproc:
        raise ValueError(
            f"--text-len {text_len} must be a multiple of ulysses x ring = {nproc} for Flux: "
            "xDiT splits the prompt tokens over the sequence-parallel ranks only then"
        )
    if args.warmup_steps < 0:
        raise ValueError("--warmup-steps must be >= 0")
    return CompareConfig(
        model=args.model,
        size=size,
        device=device,
        dtype=dtype,
        nproc=nproc,
        ulysses=ulysses,
        ring=ring,
        steps=args.steps or DEFAULT_STEPS[size],
        height=height,
        width=width,
        seed=args.seed,
        guidance=args.guidance if args.guidance is not None else GUIDANCE[args.model],
        text_len=text_len,
        qk_gain=args.qk_gain,
        warmup_steps=args.warmup_steps,
    )


def _check_pixels(model: str, size: str, height: int, width: int, sp: int) -> None:
    """Sizes xDiT and diffusers accept: 2x2 patches (PixArt) or packed 2x2 latents (Flux) of
    the VAE's latents, PixArt also a multiple of 8; and xDiT gives every sequence-parallel
    rank the same number of patch rows (it refuses an uneven split)."""
    vae = 2 if size == "tiny" else 8  # the random VAEs' downsampling factor
    base = vae * 2
    if model == "pixart":
        base = math.lcm(base, 8)
    if width % base:
        raise ValueError(f"--width {width} must be a multiple of {base} ({model} {size})")
    rows = vae * 2 * sp
    if model == "pixart":
        rows = math.lcm(rows, 8)
    if height % rows:
        raise ValueError(
            f"--height {height} must be a multiple of {rows} ({model} {size} on {sp} "
            f"sequence-parallel ranks: xDiT splits the latent rows evenly, 2 per patch)"
        )


def thresholds_for(args: argparse.Namespace, dtype: str) -> Thresholds:
    psnr, diff, rtol = DEFAULT_THRESHOLDS[dtype]
    return Thresholds(
        psnr_min=psnr if args.psnr_min is None else args.psnr_min,
        max_diff=diff if args.max_diff is None else args.max_diff,
        latent_rtol=rtol if args.latent_rtol is None else args.latent_rtol,
    )


def command_line(cfg: CompareConfig, out: str) -> str:
    """A command that repeats this comparison exactly (every setting spelled out)."""
    argv = ["tokenring-xdit", "compare", "--model", cfg.model, "--size", cfg.size]
    argv += ["--device", cfg.device, "--dtype", cfg.dtype, "--nproc", str(cfg.nproc)]
    argv += ["--ulysses-degree", str(cfg.ulysses), "--ring-degree", str(cfg.ring)]
    argv += ["--steps", str(cfg.steps), "--height", str(cfg.height), "--width", str(cfg.width)]
    argv += ["--seed", str(cfg.seed), "--guidance", f"{cfg.guidance:g}"]
    argv += ["--text-len", str(cfg.text_len), "--qk-gain", f"{cfg.qk_gain:g}"]
    argv += ["--warmup-steps", str(cfg.warmup_steps), "--out", out]
    return shlex.join(argv)


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

    from . import pipelines

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
        if cfg.warmup_steps:
            report(description="warm-up")
            pipe(**dict(kwargs, num_inference_steps=cfg.warmup_steps), **timer.kwargs(cfg.model))
        report(description="denoising")
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
    total = cfg.warmup_steps + cfg.steps
    report(description="building the pipeline", total=total, completed=0)
    pipe, kwargs = build_pipeline(cfg, device)
    result = _timed_call(pipe, kwargs, cfg, StepTimer(device, report), report)
    return dict(result, rank=rank, ranks=1, ring_calls={}, **_environment())


def xdit_worker(rank: int, nproc: int, report, cfg: CompareConfig, impl: str) -> dict:
    """xDiT's pipeline wrapper on `nproc` ranks, ring implementation `impl` chosen with
    xDiT's own --ring_impl_type flag (parsed by xFuserArgs, as in xDiT's example scripts)."""
    report(description="importing xDiT", total=cfg.warmup_steps + cfg.steps, completed=0)
    if cfg.device == "cpu":
        from . import xfuser_cpu

        xfuser_cpu.enable()  # before the first `import xfuser`
    import tokenring_xdit

    tokenring_xdit.install()  # also done by the .pth unless TOKENRING_XDIT_AUTOPATCH=0
    import torch
    from xfuser import xFuserArgs, xFuserFluxPipeline, xFuserPixArtAlphaPipeline
    from xfuser.config import FlexibleArgumentParser
    from xfuser.core.distributed import get_runtime_state, init_distributed_environment

    from . import selection

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
    calls = _count_ring_calls()
    last = rank == nproc - 1
    timer = StepTimer(device, report if last else None)
    result = _timed_call(xpipe, kwargs, cfg, timer, report if last else _quiet)
    return dict(
        result,
        rank=rank,
        ranks=nproc,
        ring_calls=dict(calls),
        ring_impl=list(selection.xdit_ring_impl()),
        attention_backend=get_runtime_state().attention_backend.name,
        **_environment(),
    )


def _quiet(**fields) -> None:
    return None


def _count_ring_calls() -> dict[str, int]:
    """Count calls into TokenRing's xDiT entry point and into xDiT's own ring (torch's
    templated ring under `usp.ring_attn`): both module globals are looked up at call time."""
    import xfuser.model_executor.layers.usp as usp

    from . import xdit_ring

    calls = {"token_ring": 0, "xdit_ring": 0}

    def counting(fn, key):
        def counted(*args, **kwargs):
            calls[key] += 1
            return fn(*args, **kwargs)

        counted.__wrapped__ = fn
        return counted

    xdit_ring.usp_ring_attn = counting(xdit_ring.usp_ring_attn, "token_ring")
    usp._templated_ring_attention = counting(usp._templated_ring_attention, "xdit_ring")
    return calls


# ------------------------------------------------------------------------------------------
# Orchestration


def _versions() -> dict:
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


def _merge_ranks(name: str, values: list[dict]) -> dict:
    """One run's summary from its ranks: the slowest rank per step, the image of the rank
    that has it, every rank's ring-call counts."""
    with_image = [v for v in values if v["image"] is not None]
    if len(with_image) != 1:
        raise RuntimeError(f"{name}: {len(with_image)} ranks returned an image, expected 1")
    steps = [max(col) for col in zip(*(v["step_s"] for v in values), strict=True)]
    first = values[0]
    summary = dict(
        label=LABELS[name],
        ranks=first["ranks"],
        s_per_step=statistics.median(steps),
        mean_s_per_step=statistics.fmean(steps),
        step_s=steps,
        total_s=max(v["total_s"] for v in values),
        threads_per_rank=first["threads_per_rank"],
        image=with_image[0]["image"],
        latents=_gather_latents([v["latents"] for v in values]),
    )
    if "gpu" in first:
        summary["gpu"] = first["gpu"]
    if name != "single":
        summary["ring_impl_type"] = RING_IMPL[name]
        summary["selected"] = first["ring_impl"]
        summary["attention_backend"] = first["attention_backend"]
        summary["ring_calls_per_rank"] = [v["ring_calls"] for v in values]
    return summary


def _gather_latents(parts: list):
    """The whole final latents from the ranks' parts: xDiT's sequence parallelism splits them
    along dim -2 (PixArt: latent rows; Flux: packed tokens) in rank order."""
    import numpy as np

    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-2)


def _path_checks(runs: dict) -> list[str]:
    """A run that did not take the ring path it claims (a silent fall-back would compare a
    ring with itself)."""
    bad = []
    for name, expect, other in (
        ("ring", "xdit_ring", "token_ring"),
        ("token_ring", "token_ring", "xdit_ring"),
    ):
        for rank, calls in enumerate(runs[name]["ring_calls_per_rank"]):
            if calls[expect] == 0 or calls[other] != 0:
                bad.append(f"{LABELS[name]} rank {rank}: ring calls {calls}")
    return bad


def latent_rel_diff(test, reference) -> float:
    import numpy as np

    scale = float(np.abs(reference).max())
    return float(np.abs(np.asarray(test) - reference).max()) / (scale or 1.0)


def compare_runs(runs: dict, thresholds: Thresholds) -> list[dict]:
    from .images import image_metrics

    out = []
    for test, ref in SHOWN:
        m = image_metrics(runs[test]["image"], runs[ref]["image"])
        m["latent_rel_diff"] = latent_rel_diff(runs[test]["latents"], runs[ref]["latents"])
        checked = (test, ref) in CHECKED
        failures = thresholds.failures(m) if checked else []
        out.append(dict(test=test, reference=ref, checked=checked, failures=failures, **m))
    return out


def _image_stats(image) -> dict:

    return dict(
        mean=float(image.mean()),
        std=float(image.std()),
        saturated_fraction=float(((image <= 0.0) | (image >= 1.0)).mean()),
    )


def run_compare(
    cfg: CompareConfig,
    thresholds: Thresholds,
    out_dir: str,
    *,
    console=None,
    quiet: bool = False,
    timeout: float = 900.0,
    gain: float | None = None,
    verbose: bool = False,
    launcher: Callable | None = None,
) -> dict:
    """Run the three launches, write images, figure and JSON into `out_dir`; return the report.

    Raises tokenring_xdit.launch.LaunchError when a rank fails.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .launch import launch

    launcher = launcher or launch
    progress = Progress(
        TextColumn("{task.fields[run]:<18}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=quiet,
    )
    plan = [
        ("single", single_worker, 1, (cfg,)),
        ("ring", xdit_worker, cfg.nproc, (cfg, RING_IMPL["ring"])),
        ("token_ring", xdit_worker, cfg.nproc, (cfg, RING_IMPL["token_ring"])),
    ]
    runs: dict[str, dict] = {}
    load_before = _load_average()
    started = time.perf_counter()
    with progress:
        tasks = {
            name: progress.add_task("waiting", total=None, run=LABELS[name]) for name, *_ in plan
        }
        for name, worker, nproc, worker_args in plan:
            task = tasks[name]

            def on_progress(rank: int, fields: dict, task=task) -> None:
                progress.update(task, **fields)

            values = launcher(
                worker,
                nproc,
                worker_args,
                device=cfg.device,
                timeout=timeout,
                env=None if verbose else _quiet_env(),
                on_progress=on_progress,
            )
            runs[name] = _merge_ranks(name, values)
            progress.update(task, description="done")
    wall = time.perf_counter() - started
    comparisons = compare_runs(runs, thresholds)
    problems = _path_checks(runs)
    passed = not problems and not any(c["failures"] for c in comparisons)
    report = _report(cfg, thresholds, runs, comparisons, problems, passed, out_dir, wall)
    # other work on the machine moves the times (not the images): say how busy it was
    report["load_average_1min"] = dict(before=load_before, after=_load_average())
    _write_outputs(cfg, runs, comparisons, report, out_dir, gain)
    return report


# The ranks' own logging, unless --verbose or set by the user: xDiT logs at DEBUG by default,
# diffusers and transformers warn about float32 modules and torchvision, torch about a renamed
# collective. Errors still show.
QUIET_ENV = {
    "LOG_LEVEL": "error",  # xfuser's logger
    "DIFFUSERS_VERBOSITY": "error",
    "TRANSFORMERS_VERBOSITY": "error",
    "PYTHONWARNINGS": "ignore::FutureWarning,ignore::DeprecationWarning",
}


def _quiet_env() -> dict[str, str]:
    return {k: v for k, v in QUIET_ENV.items() if k not in os.environ}


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _finite(x):
    """JSON has no infinity: identical images have PSNR "inf" (a string)."""
    if isinstance(x, float) and not math.isfinite(x):
        return "inf" if x > 0 else "-inf"
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def _report(cfg, thresholds, runs, comparisons, problems, passed, out_dir, wall) -> dict:
    prefix = cfg.name
    files = {name: f"{prefix}-{name}.png" for name in RUNS}
    files.update(figure=f"{prefix}-compare.png", report=f"{prefix}-compare.json")
    run_info = {}
    for name, r in runs.items():
        run_info[name] = {k: v for k, v in r.items() if k not in ("image", "latents")}
        run_info[name]["image_stats"] = _image_stats(r["image"])
        run_info[name]["file"] = files[name]
    return dict(
        tool="tokenring-xdit compare",
        passed=passed,
        command=command_line(cfg, out_dir),
        config=asdict(cfg),
        model=dict(
            name=MODEL_NAMES[cfg.model],
            size=cfg.size,
            weights="seeded random (no checkpoint), text encoders replaced by seeded prompt "
            "embeddings",
            qk_gain=cfg.qk_gain,
        ),
        thresholds=asdict(thresholds),
        runs=run_info,
        comparisons=comparisons,
        path_problems=problems,
        versions=_versions(),
        platform=platform.platform(),
        wall_s=wall,
        files=files,
    )


def _write_outputs(cfg, runs, comparisons, report, out_dir, gain) -> None:
    from .images import Panel, auto_gain, diff_map, save_png, side_by_side

    os.makedirs(out_dir, exist_ok=True)
    files = report["files"]
    for name in RUNS:
        save_png(runs[name]["image"], os.path.join(out_dir, files[name]))
    diffs = [c for c in comparisons if c["checked"]]
    if gain is None:
        gain = auto_gain(max(c["max_abs_diff"] for c in diffs))
    report["difference_gain"] = gain
    panels = []
    for name in RUNS:
        r = runs[name]
        ranks = f"{r['ranks']} rank" + ("s" if r["ranks"] > 1 else "")
        lines = [f"{r['s_per_step'] * 1e3:.1f} ms/step, {ranks}"]
        if name != "single":
            lines.append(f"--ring_impl_type {RING_IMPL[name]}")
        panels.append(Panel(r["image"], LABELS[name], lines))
    for c in diffs:
        test, ref = runs[c["test"]]["image"], runs[c["reference"]]["image"]
        title = f"|{SHORT[c['test']]} - {SHORT[c['reference']]}| x {_gain_text(gain)}"
        lines = [
            f"PSNR {_psnr_text(c['psnr_db'])} dB, SSIM {c['ssim']:.6f}",
            f"max |diff| {c['max_abs_diff']:.2e} ({c['max_abs_diff'] * 255:.2g}/255)",
            f"final latents: rel. diff {c['latent_rel_diff']:.2e}",
        ]
        lines += ["ok"] if not c["failures"] else ["FAILED:", *c["failures"]]
        panels.append(Panel(diff_map(test, ref, gain), title, lines))
    dev = "CPU" if cfg.device == "cpu" else runs["ring"].get("gpu", "GPU")
    heading = (
        f"{MODEL_NAMES[cfg.model]} ({cfg.size}, random weights), {cfg.width}x{cfg.height}, "
        f"{cfg.steps} steps, {dev} {cfg.dtype}, ulysses {cfg.ulysses} x ring {cfg.ring}: "
        + ("PASSED" if report["passed"] else "FAILED")
    )
    t = report["thresholds"]
    v = report["versions"]
    footer = [
        f"thresholds: PSNR >= {t['psnr_min']:g} dB, max |diff| <= {t['max_diff']:.3g}, "
        f"latent rel. diff <= {t['latent_rtol']:.3g}; difference maps: channel max of "
        f"|a - b| x {_gain_text(gain)}, black 0 -> white >= {1 / gain:.0e}; ms/step: median",
        f"tokenring-xdit {v['tokenring-xdit']}, torch {v['torch']}, xfuser {v['xfuser']}, "
        f"yunchang {v['yunchang']}, diffusers {v['diffusers']}",
    ]
    figure = side_by_side(panels, heading=heading, footer=footer)
    figure.save(os.path.join(out_dir, files["figure"]))
    with open(os.path.join(out_dir, files["report"]), "w") as fh:
        json.dump(_finite(report), fh, indent=2)
        fh.write("\n")


# ------------------------------------------------------------------------------------------
# CLI


def print_summary(console, report: dict) -> None:
    from rich import box
    from rich.table import Table

    def table(title: str) -> Table:
        return Table(
            title=title,
            box=box.SIMPLE_HEAD,
            show_edge=False,
            title_justify="left",
            padding=(0, 1),
        )

    runs = table("runs (ms/step: median over the steps, slowest rank)")
    for col in ("run", "ranks", "ms/step", "total s", "ring calls per rank"):
        runs.add_column(col, justify="right" if col in ("ranks", "ms/step", "total s") else "left")
    for name, r in report["runs"].items():
        calls = r.get("ring_calls_per_rank", [{}])[0]
        calls_text = ", ".join(f"{k} {v}" for k, v in calls.items()) or "-"
        runs.add_row(
            SHORT[name],
            str(r["ranks"]),
            f"{r['s_per_step'] * 1e3:.1f}",
            f"{r['total_s']:.2f}",
            calls_text,
        )
    console.print(runs)
    images = table("images and final latents")
    for col in ("test vs reference", "PSNR dB", "SSIM", "max |diff|", "latent rel.", "ok"):
        images.add_column(col, justify="left" if col == "test vs reference" else "right")
    for c in report["comparisons"]:
        ok = "[green]yes[/]" if not c["failures"] else "[bold red]NO[/]"
        images.add_row(
            f"{SHORT[c['test']]} vs {SHORT[c['reference']]}",
            _psnr_text(c["psnr_db"]),
            f"{c['ssim']:.6f}",
            f"{c['max_abs_diff']:.2e}",
            f"{c['latent_rel_diff']:.2e}",
            ok if c["checked"] else "[dim]info[/]",
        )
    console.print(images)


def _psnr_text(psnr: float) -> str:
    return "inf" if math.isinf(psnr) else f"{psnr:.1f}"


def _gain_text(gain: float) -> str:
    exponent = math.log10(gain)
    return f"1e{exponent:.0f}" if exponent == round(exponent) else f"{gain:g}"


def run_cli(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .launch import LaunchError

    console, err = Console(), Console(stderr=True)
    try:
        cfg = resolve(args)
        thresholds = thresholds_for(args, cfg.dtype)
    except ValueError as exc:
        err.print(f"[bold red]error:[/] {exc}")
        return EXIT_USAGE
    console.print(
        f"[bold]tokenring-xdit compare[/]: {MODEL_NAMES[cfg.model]} ({cfg.size}, random "
        f"weights), {cfg.width}x{cfg.height}, {cfg.steps} steps, {cfg.device} {cfg.dtype}; "
        f"diffusers in 1 process, then xDiT on {cfg.nproc} ranks (ulysses {cfg.ulysses} x "
        f"ring {cfg.ring}) with its ring and with TokenRing"
    )
    try:
        report = run_compare(
            cfg,
            thresholds,
            args.out,
            console=console,
            quiet=args.no_progress,
            timeout=args.timeout,
            gain=args.gain,
            verbose=args.verbose,
        )
    except LaunchError as exc:
        from .cli import _print_failure

        _print_failure(err, exc)
        return EXIT_WORKER
    print_summary(console, report)
    files = report["files"]
    console.print(
        f"written to {args.out}/: {files['figure']} (side by side), {files['report']}, "
        f"{', '.join(files[n] for n in RUNS)}"
    )
    failures = [f for c in report["comparisons"] for f in c["failures"]]
    failures += report["path_problems"]
    if failures:
        err.print("[bold red]compare failed:[/] " + "; ".join(failures))
        return EXIT_FAILED
    console.print(f"[green]passed[/] ({report['wall_s']:.0f} s)")
    return EXIT_OK


if __name__ == "__main__":  # python -m tokenring_xdit.compare = tokenring-xdit compare
    from .cli import main

    sys.exit(main(["compare", *sys.argv[1:]]))
