"""CPU mode (development, CI): one switch for the host's CPU shims (xfuser_cpu, diffusers_cpu).

`tokenring_xdit.enable_cpu_mode("xfuser")` before the first `import xfuser`;
`enable_cpu_mode("diffusers")` before or after importing diffusers. Each is idempotent and
reversible (`disable_cpu_mode`); the shims are listed in patches/README.md.
"""

from __future__ import annotations

import importlib
from typing import Literal

__all__ = ["enable_cpu_mode", "disable_cpu_mode"]

CpuHost = Literal["xfuser", "diffusers"]
_MODULES = {
    "xfuser": "tokenring_xdit.patches.xfuser_cpu",
    "diffusers": "tokenring_xdit.patches.diffusers_cpu",
}


def _shims(host: str):
    if host not in _MODULES:
        raise ValueError(f"CPU mode exists for {', '.join(_MODULES)}, not {host!r}")
    return importlib.import_module(_MODULES[host])


def enable_cpu_mode(host: CpuHost) -> list[str]:
    """Switch `host`'s CPU mode on; returns the patch ids applied or armed."""
    return _shims(host).enable()


def disable_cpu_mode(host: CpuHost) -> None:
    """Revert `host`'s CPU shims."""
    _shims(host).disable()
