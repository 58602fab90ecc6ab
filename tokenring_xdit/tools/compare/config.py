"""compare's settings: command-line flags, their resolution into a CompareConfig, thresholds."""

from __future__ import annotations

import argparse
import functools
import math
import shlex
from dataclasses import dataclass

from ..cli_args import add_device_and_dtype, gpu_count, positive_int, positive_number

MODELS = ("pixart", "flux")
SIZES = ("tiny", "full")
# Who runs the two ring runs: xDiT's pipeline wrappers, or diffusers' own context parallelism
# (`enable_parallelism`), which only models with a `_cp_plan` support.
HOSTS = ("xdit", "diffusers")
DEFAULT_MODEL = {"xdit": "pixart", "diffusers": "flux"}
CP_PLAN_MODELS = ("flux",)  # diffusers 0.42.1: Flux has a _cp_plan, PixArt has none
RUNS = ("single", "ring", "token_ring")
LABELS = {"single": "diffusers, 1 process", "ring": "xDiT ring", "token_ring": "xDiT + TokenRing"}
HOST_LABELS = {
    "xdit": LABELS,
    "diffusers": {
        "single": "diffusers, 1 process",
        "ring": "diffusers CP ring",
        "token_ring": "diffusers CP + TokenRing",
    },
}
HOST_NAMES = {"xdit": "xDiT", "diffusers": "diffusers' context parallelism"}
SHORT = {"single": "single", "ring": "ring", "token_ring": "TokenRing"}
# The ring each run selects: xDiT's --ring_impl_type, or set_xdit_ring_impl() under diffusers
RING_IMPL = {"ring": "default", "token_ring": "token_ring"}
# The call counter (workers) that proves a ring run took the host's own ring
OWN_RING = {"xdit": "xdit_ring", "diffusers": "diffusers_ring"}
# diffusers' CP attention backends that return the lse every ring needs (on CPU through
# tokenring_xdit.patches.diffusers_cpu)
CP_BACKEND = {"cpu": "_native_flash", "cuda": "_native_cudnn"}
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
# (image PSNR floor in dB, image max |diff| ceiling, latent max |diff| / max |latent| ceiling)
DEFAULT_THRESHOLDS = {
    "float32": (60.0, 1.0 / 255.0, 1e-4),
    "bfloat16": (35.0, math.inf, math.inf),
    "float16": (35.0, math.inf, math.inf),
}
# Pairs (test, reference): the first two decide; the last is shown for context.
CHECKED = (("token_ring", "ring"), ("token_ring", "single"))
SHOWN = (*CHECKED, ("ring", "single"))


@dataclass(frozen=True)
class CompareConfig:
    """Resolved settings (no "auto" left), identical in every run."""

    model: str = "pixart"
    size: str = "tiny"
    host: str = "xdit"
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
        """Prefix of the output files; the xDiT host keeps the names it always had."""
        base = f"{self.model}-{self.size}"
        return base if self.host == "xdit" else f"{base}-{self.host}"

    @property
    def labels(self) -> dict[str, str]:
        return HOST_LABELS[self.host]


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


def add_arguments(p: argparse.ArgumentParser) -> None:
    """compare's flags, in groups (their order is --help's)."""
    _run_arguments(p)
    add_device_and_dtype(p)
    _check_arguments(p)
    _model_arguments(p)
    _output_arguments(p)


def _run_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what runs")
    g.add_argument(
        "--model",
        choices=MODELS,
        default=None,
        help="pipeline (default: pixart with --host xdit, flux with --host diffusers)",
    )
    g.add_argument(
        "--host",
        choices=HOSTS,
        default="xdit",
        help="what runs the two ring runs: xdit (xDiT's pipeline wrapper, --ring_impl_type "
        "default / token_ring) or diffusers (diffusers' own context parallelism, "
        "enable_parallelism(ContextParallelConfig(ring_degree=N)), its ring / TokenRing; "
        "models with a _cp_plan only: flux). Default xdit",
    )
    g.add_argument(
        "--size",
        choices=SIZES,
        default="tiny",
        help="tiny: a 2-layer model, seconds on CPU; full: the real PixArt-alpha XL-2 1024 / "
        "Flux.1-dev architecture (GPU). Weights are seeded random either way (default tiny)",
    )
    g.add_argument(
        "--nproc",
        type=positive_int,
        default=None,
        help="ranks of the ring runs (default: ulysses x ring if given, else the GPU count "
        "with CUDA, at least 2; 2 on CPU)",
    )
    g.add_argument("--ulysses-degree", type=positive_int, default=1, help="ulysses degree (1)")
    g.add_argument(
        "--ring-degree",
        type=positive_int,
        default=None,
        help="ring degree, at least 2 (default: nproc / ulysses)",
    )
    g.add_argument(
        "--steps",
        type=positive_int,
        default=None,
        help=f"denoising steps (default {DEFAULT_STEPS['tiny']} tiny, {DEFAULT_STEPS['full']} "
        "full)",
    )
    g.add_argument(
        "--height",
        type=positive_int,
        default=None,
        help=f"pixels (default {DEFAULT_PIXELS['tiny']} tiny, {DEFAULT_PIXELS['full']} full)",
    )
    g.add_argument("--width", type=positive_int, default=None, help="pixels (default: as height)")
    g.add_argument("--seed", type=int, default=0, help="seed of weights, prompt and latents (0)")
    g.add_argument(
        "--out", metavar="DIR", default="tokenring-compare", help="output folder (created)"
    )


def _check_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what the comparison checks")
    g.add_argument(
        "--psnr-min",
        type=float,
        default=None,
        help="image PSNR floor in dB (default 60 for float32, 35 for bf16/fp16)",
    )
    g.add_argument(
        "--max-diff",
        type=float,
        default=None,
        help="image max |diff| ceiling, pixels in [0, 1] (default 1/255 for float32, "
        "unchecked (inf) for bf16/fp16)",
    )
    g.add_argument(
        "--latent-rtol",
        type=float,
        default=None,
        help="final latents' max |diff| / max |latent| ceiling (default 1e-4 for float32, "
        "unchecked (inf) for bf16/fp16)",
    )


def _model_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("the random model and its prompt")
    g.add_argument(
        "--qk-gain",
        type=positive_number(),
        default=DEFAULT_QK_GAIN,
        help="multiply every self-attention's logits by this (random weights give nearly "
        f"uniform attention, which hides ring errors); 1 = the plain random model "
        f"(default {DEFAULT_QK_GAIN:g})",
    )
    g.add_argument(
        "--text-len",
        type=positive_int,
        default=None,
        help="prompt tokens (seeded random embeddings; default 16 tiny, 120 PixArt full, "
        "512 Flux full); for Flux a multiple of ulysses x ring",
    )
    g.add_argument("--guidance", type=float, default=None, help="guidance scale (4.5 / 3.5)")
    g.add_argument(
        "--warmup-steps",
        type=int,
        default=2,
        help="an untimed call of this many steps before the timed one (0: none; default 2)",
    )


def _output_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output and limits")
    g.add_argument(
        "--gain",
        type=positive_number(),
        default=None,
        help="amplification of the difference maps (default: the power of ten that shows "
        "the largest difference)",
    )
    g.add_argument(
        "--timeout",
        type=positive_number("seconds"),
        default=900.0,
        help="seconds per run before it is killed (900)",
    )
    g.add_argument(
        "--force",
        action="store_true",
        help="run on CPU even when the estimate says the weights do not fit in memory",
    )
    g.add_argument("--no-progress", action="store_true", help="no live progress display")
    g.add_argument(
        "--verbose",
        action="store_true",
        help="keep the ranks' own logging (xDiT, diffusers, warnings); default: errors only",
    )


def resolve(args: argparse.Namespace, gpus: int | None = None) -> CompareConfig:
    """Fill in the defaults; ValueError on a bad combination, naming the flags the user gave.
    `gpus` = None: counted (cli_args.gpu_count) only when a setting depends on it."""
    count = functools.cache(gpu_count) if gpus is None else (lambda: gpus)
    host = getattr(args, "host", "xdit")
    model = _model_for(host, args.model)
    ulysses = args.ulysses_degree
    if args.nproc is not None:
        nproc = args.nproc
    elif args.ring_degree is not None:
        nproc = ulysses * args.ring_degree
    elif args.device != "cpu" and count() >= 2:
        nproc = count()
    else:
        nproc = 2 * ulysses
    if nproc % ulysses:
        raise ValueError(f"--nproc {nproc} is not a multiple of --ulysses-degree {ulysses}")
    ring = args.ring_degree if args.ring_degree is not None else nproc // ulysses
    if ulysses * ring != nproc:
        times = f"--ulysses-degree {ulysses} x " if ulysses != 1 else ""
        raise ValueError(f"{times}--ring-degree {ring} must equal --nproc {nproc}")
    if ring < 2:
        raise ValueError("--ring-degree must be at least 2: with 1 there is no ring to compare")
    device = args.device
    if device == "auto":
        device = "cuda" if count() >= nproc else "cpu"
    if device == "cuda" and count() < nproc:
        raise ValueError(f"--device cuda needs one GPU per rank: {nproc} ranks, {count()} GPU(s)")
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")
    if device == "cpu" and dtype != "float32":
        kernel = "xDiT's" if host == "xdit" else "the ring runs'"
        raise ValueError(f"on CPU use --dtype float32 ({kernel} CPU kernel is float32)")
    size = args.size
    height = args.height or args.width or DEFAULT_PIXELS[size]
    width = args.width or height
    _check_pixels(model, size, height, width, nproc, _pixel_flags(args))
    text_len = args.text_len or DEFAULT_TEXT_LEN[(model, size)]
    if model == "flux" and text_len % nproc:
        why = {
            "xdit": "xDiT splits the prompt tokens over the sequence-parallel ranks only then",
            "diffusers": "diffusers' context parallelism splits the prompt tokens evenly",
        }[host]
        raise ValueError(
            f"--text-len {text_len} must be a multiple of ulysses x ring = {nproc} for Flux: {why}"
        )
    if args.warmup_steps < 0:
        raise ValueError("--warmup-steps must be >= 0")
    return CompareConfig(
        model=model,
        size=size,
        host=host,
        device=device,
        dtype=dtype,
        nproc=nproc,
        ulysses=ulysses,
        ring=ring,
        steps=args.steps or DEFAULT_STEPS[size],
        height=height,
        width=width,
        seed=args.seed,
        guidance=args.guidance if args.guidance is not None else GUIDANCE[model],
        text_len=text_len,
        qk_gain=args.qk_gain,
        warmup_steps=args.warmup_steps,
    )


def _model_for(host: str, model: str | None) -> str:
    """The model for `host` (its default when not given); ValueError when the host cannot run
    it: diffusers' context parallelism needs the model's `_cp_plan`, which PixArt lacks."""
    if model is None:
        return DEFAULT_MODEL[host]
    if host == "diffusers" and model not in CP_PLAN_MODELS:
        raise ValueError(
            f"--host diffusers cannot run --model {model}: diffusers' context parallelism needs "
            f"a model with a _cp_plan, which {MODEL_NAMES[model]} has not in diffusers "
            f"(use --model {' / '.join(CP_PLAN_MODELS)}, or --host xdit)"
        )
    return model


def _pixel_flags(args: argparse.Namespace) -> dict[str, str]:
    """How to name the height and the width in an error: by the flag the user gave (the other
    side defaults to it), or as a default."""
    names = {}
    for side, other in (("height", "width"), ("width", "height")):
        if getattr(args, side) is not None:
            names[side] = f"--{side} {{}}"
        elif getattr(args, other) is not None:
            names[side] = f"--{other} {{}} (the {side} too: --{side} defaults to it)"
        else:
            names[side] = f"the default {side} {{}} (set --{side})"
    return names


def _check_pixels(
    model: str, size: str, height: int, width: int, sp: int, flags: dict[str, str]
) -> None:
    """Sizes xDiT and diffusers accept: 2x2 patches (PixArt) or packed 2x2 latents (Flux) of
    the VAE's latents, PixArt also a multiple of 8; and xDiT gives every sequence-parallel
    rank the same number of patch rows (it refuses an uneven split). `flags`: _pixel_flags."""
    vae = 2 if size == "tiny" else 8  # the random VAEs' downsampling factor
    base = vae * 2
    if model == "pixart":
        base = math.lcm(base, 8)
    if width % base:
        name = flags["width"].format(width)
        raise ValueError(f"{name} must be a multiple of {base} ({model} {size})")
    rows = vae * 2 * sp
    if model == "pixart":
        rows = math.lcm(rows, 8)
    if height % rows:
        raise ValueError(
            f"{flags['height'].format(height)} must be a multiple of {rows} ({model} {size} on "
            f"{sp} sequence-parallel ranks: xDiT splits the latent rows evenly, 2 per patch)"
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
    argv += ["--host", cfg.host]
    argv += ["--device", cfg.device, "--dtype", cfg.dtype, "--nproc", str(cfg.nproc)]
    argv += ["--ulysses-degree", str(cfg.ulysses), "--ring-degree", str(cfg.ring)]
    argv += ["--steps", str(cfg.steps), "--height", str(cfg.height), "--width", str(cfg.width)]
    argv += ["--seed", str(cfg.seed), "--guidance", f"{cfg.guidance:g}"]
    argv += ["--text-len", str(cfg.text_len), "--qk-gain", f"{cfg.qk_gain:g}"]
    argv += ["--warmup-steps", str(cfg.warmup_steps), "--out", out]
    return shlex.join(argv)
