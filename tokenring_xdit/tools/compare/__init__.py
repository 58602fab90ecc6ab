"""`tokenring-xdit compare`: one image made three ways ("single": plain diffusers, one process;
"ring": the host's own ring on N ranks; "token_ring": the same launch with TokenRing), compared
pixel by pixel and latent by latent (docs/compare.md: runs, outputs, thresholds, --qk-gain).

Each run is its own launch (tools.launch) building the same seeded random pipeline
(tools.pipelines; nothing is downloaded). The run fails (exit 1) when TokenRing misses a
threshold against either reference, or when a run did not take the ring path it claims.

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
