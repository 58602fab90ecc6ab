"""Sliding-window training calls (forward + backward) of the K/V family, priced from its plan.

The K/V family runs a windowed call from `ring/packed/kv_plan.py`: per rank the diagonal and,
per step and half, a block that is the window-free flag, segments (some with a band) or
skipped; its rows keep only the transfers later blocks need (`kept_steps`: a half's K/V travel
while a later holder runs a block with it, its dK/dV sum goes holder to holder within a run of
such holders and home from the run's last one). This prices that plan as planner/window.py
prices TokenRing's (blocks the window left whole on cuDNN, segments on the band kernel by
tiles: `window._block_ms`, a half's blocks on the half's heads) and simulates its rows with
kv_both_ways' `kv_row` (the full table's bytes, sums and memory passes), through
`window.simulated`.

The family runs zigzag shards only: a rank's back chunk meets the end of its neighbour's back
chunk after the wrap, so with any window a half still crosses the whole ring (the schedule's
windows' Note), at L·Hkv·d per step and direction whatever W is.
"""

from __future__ import annotations

from ..ring.packed.kv_plan import KvPlan, kv_plan
from ..ring.schedules.kv_both_ways import KvStep, split_by_heads
from ..ring.schedules.window import Window
from .kv_both_ways import TrainShape, half_shape, kv_row
from .machine import Machine
from .window import BAND_KERNEL, _block_ms, simulated

__all__ = ["kv_plan_for", "kv_window_train_ms"]


def kv_plan_for(n: int, local: int, window: int | None, kv_heads: int) -> KvPlan:
    """The K/V family's plan of a causal call with a window of `window` tokens (None: none)
    over `n` zigzag shards of `local` tokens with `kv_heads` K/V heads."""
    if window is not None and window < 1:
        raise ValueError(f"a window is at least 1 token, got {window}")
    w = None if window is None else Window(window - 1, 0)
    return kv_plan(None, (local,) * n, True, split_by_heads(kv_heads), w)


def _rows(m: Machine, s: TrainShape, plan: KvPlan, backward: bool, kernel: str) -> list:
    """Every rank's rows of the plan: its blocks priced as planner/window.py prices TokenRing's
    (a half's on the half's heads), its kept transfers."""
    n, hs = len(plan.q_lens), half_shape(s)[0]

    def block_ms(r: int, st: KvStep, x: int, q: int, kv: int) -> float | None:
        if st.diagonal:
            return _block_ms(m, s, plan.diagonal(r), q, kv, kernel)
        mask = plan.block(r, st.step, x)
        return None if mask == () else _block_ms(m, hs, mask, q, kv, kernel)

    table = zip(*(plan.steps(r) for r in range(n)), strict=True)
    return [[kv_row(m, s, n, r, st, backward, block_ms) for r, st in enumerate(sts)]
            for sts in table if backward or sts[0].kernel]  # fmt: skip


def kv_window_train_ms(
    m: Machine, s: TrainShape, ranks: list[int], window: int | None,
    band_kernel: str = BAND_KERNEL,
) -> dict:  # fmt: skip
    """Predicted GPU ms of one causal forward + backward call of the K/V family with a window
    of `window` tokens (None: none) on the ring `ranks` (two or more), zigzag shards of
    `s.tokens`: `window.simulated`'s keys ("kernels": the plan's block calls, one pass) and
    "kv_hops" (the most K/V half transfers one rank sends, one pass)."""
    n = len(ranks)
    if n < 2 or not s.causal:
        raise ValueError(f"a windowed ring call is causal over two or more ranks, got {n}")
    plan = kv_plan_for(n, s.tokens, window, s.kv_heads)
    out = simulated(m, s, ranks, lambda backward: _rows(m, s, plan, backward, band_kernel))
    out["kernels"] = sum(plan.kernel_calls(r) for r in range(n))
    out["kv_hops"] = max(sum(h.send_to is not None for st in plan.steps(r) for h in st.halves)
                         for r in range(n))  # fmt: skip
    return out
