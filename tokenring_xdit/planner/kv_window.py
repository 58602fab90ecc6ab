"""Sliding-window training calls (forward + backward) of the K/V family, priced from its plan.

The K/V family runs a windowed call from `ring/packed/kv_plan.py`: per rank the diagonal and,
per step and half, a block that is the window-free flag, segments (some with a band) or
skipped; its rows keep only the transfers later blocks need (`kept_steps`: a half's K/V travel
while a later holder runs a block with it, its dK/dV sum goes holder to holder within a run of
such holders and home from the run's last one). This prices that plan as planner/window.py
prices TokenRing's (blocks the window left whole on cuDNN, segments on the band kernel by
tiles: `window._block_ms`, a half's blocks on the half's heads) and simulates its rows as
kv_both_ways' `_kv_rows` does (same bytes, sums and memory passes), through `window.simulated`.

The family runs zigzag shards only: a rank's back chunk meets the end of its neighbour's back
chunk after the wrap, so with any window a half still crosses the whole ring (the schedule's
windows' Note), at L·Hkv·d per step and direction whatever W is.
"""

from __future__ import annotations

from dataclasses import replace

from ..ring.packed.kv_plan import KvPlan, kv_plan
from ..ring.schedules.blocks import FRONT, part_len
from ..ring.schedules.kv_both_ways import A, B, KvStep, front_len, half_ranges, split_by_heads
from ..ring.schedules.window import Window
from .kv_both_ways import BWD_OVER_FWD, Row, TrainShape
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


def _half_shape(s: TrainShape) -> tuple[TrainShape, list[int]]:
    """(a half's shape: its query and K/V heads, its tokens of A and B) as `_kv_rows` cuts."""
    by_heads = split_by_heads(s.kv_heads)
    half = replace(s, heads=s.heads // 2, kv_heads=s.kv_heads // 2) if by_heads else s
    return half, [sum(b - a for a, b in half_ranges(s.tokens, True, by_heads)[x]) for x in (A, B)]


def _rank_row(
    m: Machine, s: TrainShape, plan: KvPlan, r: int, st: KvStep, backward: bool, kernel: str
) -> Row:  # fmt: skip
    """One rank's row at one step: its blocks (the diagonal, or a half's each), the kept K/V and
    dK/dV transfers, and the memory passes `_kv_rows` counts for them."""
    hs, tokens = _half_shape(s)
    e, d, L, n = s.dtype_bytes, s.head_dim, s.tokens, len(plan.q_lens)
    travel = 4 if n > 2 else e  # the sums travel in fp32 beyond two ranks
    k = _block_ms(m, s, plan.diagonal(r), L, L, kernel) if st.diagonal else 0.0
    mem = 0.0
    flows = []
    for x, half in enumerate(st.halves):
        mask = plan.block(r, st.step, x) if st.kernel and not st.diagonal else ()
        if mask != ():
            q = part_len(half.q_part, L)
            kv = front_len(L, x, True, plan.by_heads) if half.kv_part == FRONT else tokens[x]
            k += _block_ms(m, hs, mask, q, kv, kernel)
            mem += q * hs.heads * (d * (2 * 4 + e) if backward else d * (e + 8) + 3 * 4)
            if backward:  # the half's running dK/dV sum
                mem += 2 * kv * hs.kv_heads * d * (2 * travel + e)
        if half.send_to is not None:
            flows.append((half.send_to, 2 * tokens[x] * hs.kv_heads * d * e))
        if backward and half.grad_send_to is not None:
            flows.append((half.grad_send_to, 2 * tokens[x] * hs.kv_heads * d * travel))
        home = half.home_from is not None or (not st.kernel and half.grad_recv_from is not None)
        if backward and home:  # our own half's sum came home
            mem += 2 * tokens[x] * hs.kv_heads * d * (8 + travel)
    return (k * (BWD_OVER_FWD if backward else 1), m.mem_ms(mem), flows)


def _rows(m: Machine, s: TrainShape, plan: KvPlan, backward: bool, kernel: str) -> list:
    n = len(plan.q_lens)
    table = list(zip(*(plan.steps(r) for r in range(n)), strict=True))
    return [[_rank_row(m, s, plan, r, st, backward, kernel) for r, st in enumerate(sts)]
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
