"""Which of xDiT's attention backends run in tokenring_xdit's CPU mode (no xfuser import here).

xfuser registers its GPU kernels without a device check: `--attention_backend FLASH` on a CPU
reaches flash-attn's import guard and ends in `NameError: name 'flash_attn_func_2' is not
defined`. CPU mode refuses such a choice first, naming the cause and the fix.
"""

from __future__ import annotations

__all__ = ["CPU_BACKENDS", "refuse_without_cpu_version"]

# AttentionBackendType names whose kernels run on CPU tensors: torch's SDPA (no lse) and its
# math path, and SDPA_FLASH (CPU mode's dispatch to torch's CPU flash kernel, which has an lse)
CPU_BACKENDS = ("SDPA", "SDPA_MATH", "SDPA_FLASH")


def refuse_without_cpu_version(backend: str | None) -> None:
    """ValueError for an explicit --attention_backend with no CPU kernel (None: automatic)."""
    if backend is None or backend.upper() in CPU_BACKENDS:
        return
    raise ValueError(
        f"--attention_backend {backend} has no CPU version (tokenring_xdit's CPU mode runs xDiT "
        "on CPU tensors): leave --attention_backend out (CPU mode then picks SDPA_FLASH, the CPU "
        "kernel that returns the lse a ring needs) or pass --attention_backend SDPA_FLASH; "
        "run on GPUs for the others"
    )
