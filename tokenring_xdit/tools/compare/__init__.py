"""`tokenring-xdit compare`: one image made three ways, compared pixel by pixel.

1. "single": plain diffusers in one process (no xDiT, no ring);
2. "ring": xDiT (xfuser 0.7.0) on N ranks with its own ring (`--ring_impl_type default`);
3. "token_ring": the same xDiT launch with TokenRing (`--ring_impl_type token_ring`).

With `--host diffusers` (Flux only: diffusers' CP needs the model's `_cp_plan`) runs 2 and 3 are
diffusers' own context parallelism instead, `transformer.enable_parallelism(config=
ContextParallelConfig(ring_degree=N))`, with diffusers' ring and with TokenRing selected
(`set_xdit_ring_impl`); TokenRing's calls are counted by `tokenring_xdit.calls_by_host()`.

Each run is its own launch (tokenring_xdit.tools.launch: gloo on CPU with xDiT's CPU mode, NCCL
with one GPU per rank) and builds the same pipeline from tokenring_xdit.tools.pipelines: real
PixArt-alpha / Flux.1 architectures with seeded random weights ("tiny" or "full" size), prompt
embeddings in place of the text encoders, the same seeded starting latents. Nothing is
downloaded.

The images are compared as floats in [0, 1] (PSNR, SSIM, max |diff|, scikit-image) and so are
the final latents (max |diff| relative to their largest value). The run fails (exit 1) when
TokenRing vs xDiT's ring or TokenRing vs the single process misses a threshold, or when a run
did not take the ring path it claims (calls into TokenRing and into xDiT's ring are counted).

Random weights give almost uniform attention (logits near 0): then a ring that loses or repeats
key blocks, or merges them with wrong weights, still produces nearly the right output. So by
default every self-attention's logits are multiplied by --qk-gain (16), by scaling its q and k
projections (or, with q/k RMSNorm as in Flux, the norms' weights) by sqrt(gain): each query then
attends to a few keys. --qk-gain 1 runs the plain random model.

Modules: config (flags, CompareConfig, thresholds), workers (the pipeline and the per-rank
workers), report (metrics, JSON, figures, summary), run (the launches and the CLI entry point).
Importing the package is cheap (the CLI imports it to build its parser): torch, rich, xfuser and
the image libraries load inside the functions that need them.
"""

from ..cli_args import EXIT_FAILED, EXIT_OK, EXIT_USAGE, EXIT_WORKER
from .config import (
    DEFAULT_QK_GAIN,
    DEFAULT_TEXT_LEN,
    DEFAULT_THRESHOLDS,
    GUIDANCE,
    CompareConfig,
    Thresholds,
    add_arguments,
    resolve,
    thresholds_for,
)
from .report import latent_rel_diff
from .run import run_cli, run_compare
from .workers import (
    StepTimer,
    build_pipeline,
    diffusers_worker,
    initial_latents,
    sharpen_attention,
    single_worker,
    xdit_worker,
)

__all__ = [
    "DEFAULT_QK_GAIN",
    "DEFAULT_TEXT_LEN",
    "DEFAULT_THRESHOLDS",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "EXIT_WORKER",
    "GUIDANCE",
    "CompareConfig",
    "StepTimer",
    "Thresholds",
    "add_arguments",
    "build_pipeline",
    "diffusers_worker",
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
