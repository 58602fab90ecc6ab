"""How much slower than the machine our test deadlines were set on this one runs right now.

Multi-rank tests wait on deadlines (a launch's timeout, a group's timeout, a peer's grace). They
were set on an idle 2-core machine running the suite with two workers; on a busy laptop or a
shared CI runner every rank starts and computes several times slower, and a fixed deadline fails
a test that would have passed. So deadlines are written as `scaled(seconds)`: the seconds times
`slowness()`, the time this machine takes to import torch (what every rank does first) over the
time it took there, or the last minute's load average per core if that is larger (one reading
can fall in a lull of the other work). It is measured once per run (conftest does it before the
workers start) and handed to every worker and rank through the environment; set
TOKENRING_TESTS_SLOWNESS yourself to fix it (1 for the plain deadlines).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time

__all__ = ["ENV", "REFERENCE_IMPORT_S", "import_seconds", "scaled", "slowness"]

ENV = "TOKENRING_TESTS_SLOWNESS"
# `import torch, torch.distributed` on the machine the deadlines were set on (2 cores, idle, warm
# page cache, torch 2.13 CPU): 2.7 s
REFERENCE_IMPORT_S = 2.7
# A cold page cache (the first import after boot took 22.7 s there) says little about the rest of
# the run: a slow first reading on a machine that is not busy is taken again, and the factor
# never exceeds this.
MAX_SLOWNESS = 20.0

_IMPORT = "import torch, torch.distributed"


def import_seconds() -> float:
    """Seconds a fresh interpreter takes to import torch here, now (a slow reading that the load
    does not explain is retaken once: the second one has the page cache warm)."""

    def once() -> float:
        start = time.monotonic()
        subprocess.run([sys.executable, "-c", _IMPORT], check=True, timeout=600)
        return time.monotonic() - start

    first = once()
    if first < 2 * REFERENCE_IMPORT_S or _load_per_core() >= 1.0:
        return first
    return min(first, once())


@functools.cache
def slowness() -> float:
    """This machine's slowness factor (>= 1): from the environment if set, else measured now and
    put there, so processes started from here (test workers, ranks) use the same value."""
    given = os.environ.get(ENV)
    if given:
        return max(1.0, float(given))
    measured = import_seconds() / REFERENCE_IMPORT_S
    factor = min(MAX_SLOWNESS, max(1.0, measured, _load_per_core()))
    os.environ[ENV] = f"{factor:.2f}"
    return float(os.environ[ENV])


def _load_per_core() -> float:
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # not available here
        return 0.0


def scaled(seconds: float) -> float:
    """`seconds` (a deadline set on the reference machine) for this machine now."""
    return seconds * slowness()
