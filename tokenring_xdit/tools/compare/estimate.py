"""What a compare run will cost on the CPU: memory per rank and wall time, before it starts.

A full-size model in fp32 on a CPU is hours of work (PixArt-alpha at 1024 px) or does not fit at
all (Flux.1-dev: 48 GB of weights per process). The estimate is rough on purpose: weights from
the real architectures' parameter counts (kept true by a test against the pipelines), compute
as 2 x parameters x tokens for the linear layers plus 4 x tokens^2 x width per attention layer,
divided by the matrix-multiply speed measured on this machine.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from .config import CompareConfig


@dataclass(frozen=True)
class Shape:
    """What the estimate needs of a model: parameter counts, attention layers and width,
    images per transformer call (PixArt runs classifier-free guidance as a batch of 2), and the
    downsampling from pixels to transformer tokens (VAE x patch)."""

    params: int
    vae_params: int
    layers: int
    width: int
    batch: int
    pixels_per_token: int
    joint_text: bool  # Flux attends over text + image tokens; PixArt's text is cross-attention


# Checked against tools/pipelines.py by tests/unit/test_tools_compare_estimate.py
SHAPES = {
    ("pixart", "tiny"): Shape(53_376, 43_711, 2, 32, 2, 4, False),
    ("pixart", "full"): Shape(611_349_152, 83_653_863, 28, 1152, 2, 16, False),
    ("flux", "tiny"): Shape(77_984, 43_619, 2, 32, 1, 4, True),
    ("flux", "full"): Shape(11_901_408_320, 83_819_683, 57, 3072, 1, 16, True),
}
# Activations on top of the weights (VAE decoding at full resolution dominates): per megapixel
ACTIVATION_BYTES_PER_MPIXEL = 3 * 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GIB = 2**30


@dataclass(frozen=True)
class Estimate:
    ranks: int  # processes of a ring run, at once
    weight_bytes: int  # one process
    process_bytes: int  # one process, weights + activations
    flops: float  # all three runs
    seconds: float | None  # None: not measured
    memory_bytes: int | None  # this machine's RAM (None: unknown)

    @property
    def peak_bytes(self) -> int:
        return self.ranks * self.process_bytes

    @property
    def cannot_fit(self) -> bool:
        """The ring runs' weights alone exceed the machine's memory: it cannot work."""
        return self.memory_bytes is not None and self.ranks * self.weight_bytes > self.memory_bytes

    @property
    def may_not_fit(self) -> bool:
        return self.memory_bytes is not None and self.peak_bytes > self.memory_bytes


def estimate(cfg: CompareConfig, flops_per_s: float | None) -> Estimate:
    """The cost of `cfg` (three runs: 1 process, then two of nproc ranks each)."""
    shape = SHAPES[(cfg.model, cfg.size)]
    weight_bytes = (shape.params + shape.vae_params) * DTYPE_BYTES[cfg.dtype]
    mpixels = cfg.height * cfg.width / 1e6
    process_bytes = weight_bytes + int(ACTIVATION_BYTES_PER_MPIXEL * mpixels)
    tokens = cfg.height * cfg.width // shape.pixels_per_token**2
    attended = tokens + (cfg.text_len if shape.joint_text else 0)
    per_step = 2 * shape.params * attended + 4 * attended**2 * shape.width * shape.layers
    flops = 3 * per_step * shape.batch * (cfg.steps + cfg.warmup_steps)
    return Estimate(
        ranks=cfg.nproc,
        weight_bytes=weight_bytes,
        process_bytes=process_bytes,
        flops=float(flops),
        seconds=flops / flops_per_s if flops_per_s else None,
        memory_bytes=total_memory(),
    )


def total_memory() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def matmul_flops_per_s(budget_s: float = 0.3) -> float:
    """fp32 matrix-multiply speed of this CPU with torch's threads (what the runs share)."""
    import torch

    a = torch.randn(512, 512)
    a @ a  # first call: thread pool start-up
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < budget_s:
        a @ a
        done += 1
    return done * 2 * 512**3 / (time.perf_counter() - start)


def describe(est: Estimate) -> str:
    """One sentence: memory and time of the whole comparison."""
    text = (
        f"needs about {est.process_bytes / GIB:.1f} GiB per process ({est.weight_bytes / GIB:.1f} "
        f"GiB of weights), {est.peak_bytes / GIB:.1f} GiB while the {est.ranks} ranks run"
    )
    if est.memory_bytes is not None:
        text += f" (this machine has {est.memory_bytes / GIB:.0f} GiB)"
    if est.seconds is not None:
        text += f", and about {_duration(est.seconds)} of CPU work"
    return text


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
