"""Which ulysses x ring split and which ring, for a model, a sequence and a machine.

A cost model in the open (docs/planner.md): per-block kernel times from a calibration table,
link latency and bandwidth per fabric from NCCL measurements, and the TokenRing, K/V-ring,
all-gather-ring and ulysses schedules simulated step by step. Importing this package is cheap
(numpy/scipy load only when a prediction is made); nothing here imports torch.
"""

from __future__ import annotations

__all__ = ["choose_ring"]


def choose_ring(*args, **kwargs):  # noqa: D103 - thin lazy re-export, documented in choose.py
    from .choose import choose_ring as _choose_ring

    return _choose_ring(*args, **kwargs)
