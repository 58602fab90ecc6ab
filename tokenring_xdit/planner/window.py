"""Sliding-window training calls (forward + backward) of TokenRing, priced from the window's plan.

The ring runs a windowed call from `ring/packed/window_plan.py`: per rank and step a block is
the causal flag (the window left it alone), segments (some with a band), or skipped; transfers
no later holder needs are dropped, and on contiguous causal shards a travelling query is cut to
the rows the window reaches. This prices that same plan with kv_both_ways' step simulation
(`_simulate`: links, overlap loss, memory passes, a graphed call's copies):

- a block the window left alone: the call's dense kernel (cuDNN), as `kv_both_ways.train_ms`;
- a block of segments: the band kernel that runs them (torch's flash op, kernels/window.py),
  one call per segment, each priced as the calibration table's dense block of its rows x
  columns (rounded up to whole tiles) times the share of its TILE x TILE tiles that hold a
  visible pair (a flash kernel skips tiles wholly outside the band and computes the others
  whole), and never under one tile's block (the launch); a causal segment is the band
  0 <= row - column;
- transfers: what the plan moves (its `transfers` and returns), at the rows its parts hold.

So a window one token short of a shard edge can price a little (a few %) over the wider one
whose block is the causal flag again (tiles vs the measured causal block), and with bands on
flash's rate a window near the sequence can cost more than none (flash runs ~0.55x cuDNN).

Ulysses with a window runs one band kernel over the whole sequence (its heads / U): the
planner's ulysses prediction (`workload.split_prediction`) with its kernels rescaled by the
band kernel's rate over cuDNN's and by the band's share of the causal call's tiles,
all-to-alls unchanged.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..ring.packed.doc_split import CONTIGUOUS, ROW
from ..ring.packed.window_plan import WindowPlan, window_plan
from ..ring.schedules.blocks import BlockStep, part_len
from ..ring.schedules.window import Window
from ..ring.segments import Segment
from .kv_both_ways import BWD_OVER_FWD, Row, TrainShape, _copies_ms, _fwd_ms, _simulate
from .machine import Machine
from .schedules import LSE_BYTES
from .workload import Workload, split_prediction

__all__ = ["TILE", "SPLITS", "tile_share", "plan_for", "window_train_ms", "simulated",
           "ulysses_window_ms", "pick_split", "q_rows"]  # fmt: skip

TILE = 128  # the band kernel's tile edge (flash on Hopper, head dim 128)
SPLITS = (ROW, CONTIGUOUS)  # the zigzag and contiguous causal shards
BAND_KERNEL = "flash"  # torch's flash op runs a window's segments (names.WINDOWED)


@functools.lru_cache(maxsize=4096)
def tile_share(n_q: int, n_k: int, lo: int | None, hi: int | None) -> float:
    """Share of the TILE x TILE tiles of an n_q x n_k block holding a pair with
    lo <= row - column <= hi (None: unbounded)."""
    first = np.arange(0, n_q, TILE)
    last = np.minimum(first + TILE, n_q) - 1
    c0 = np.maximum(first - hi, 0) if hi is not None else np.zeros_like(first)
    c1 = np.minimum(last - lo, n_k - 1) if lo is not None else np.full_like(first, n_k - 1)
    touched = np.where(c1 >= c0, c1 // TILE - c0 // TILE + 1, 0).sum()
    return float(touched) / (len(first) * math.ceil(n_k / TILE))


def _segment_ms(m: Machine, s: TrainShape, seg: Segment, kernel: str) -> float:
    n_q, n_k = seg.q1 - seg.q0, seg.k1 - seg.k0
    whole = (TILE * math.ceil(x / TILE) for x in (n_q, n_k))  # a kernel runs whole tiles
    dense = m.table.block_ms(*whole, s.heads, s.head_dim, s.dtype, kernel=kernel)
    band = seg.band or ((0, None) if seg.causal else (None, None))
    # skipped tiles save their work, not the call's launch (one tile's block: the table's floor)
    launch = m.table.block_ms(TILE, TILE, s.heads, s.head_dim, s.dtype, kernel=kernel)
    return max(launch, dense * tile_share(n_q, n_k, *band))


def _block_ms(m: Machine, s: TrainShape, mask, q: int, kv: int, kernel: str) -> float:
    """Forward ms of one block: a causal flag on the dense kernel, segments on the band one."""
    if isinstance(mask, bool):
        return _fwd_ms(m, s, q, kv, s.heads, mask)
    return sum(_segment_ms(m, s, seg, kernel) for seg in mask)


def plan_for(n: int, local: int, window: int | None, split: str = ROW) -> WindowPlan:
    """The plan of a causal call with a window of `window` tokens (None: none) over `n` shards
    of `local` tokens in `split`."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if window is not None and window < 1:
        raise ValueError(f"a window is at least 1 token, got {window}")
    w = Window(-1, 0) if window is None else Window(window - 1, 0)
    return window_plan(w, True, (local,) * n, split)


def _rank_step(
    m: Machine, s: TrainShape, plan: WindowPlan, r: int, st: BlockStep, backward: bool,
    kernel: str,
) -> Row:  # fmt: skip
    """One rank's row at one step, as `kv_both_ways._token_ring_rows` prices it."""
    e, d, h, L = s.dtype_bytes, s.head_dim, s.heads, s.tokens
    q_per = 2 * d * e + 2 * LSE_BYTES if backward else d * e  # (Q, dO, lse, delta) or Q
    ret_per = d * e if backward else d * e + LSE_BYTES  # dQ or (out, lse)
    acc = 4 if plan.size > 2 else e
    q_send, _, ret_recv = plan.transfers(r)[st.step]
    k = mem = 0.0
    flows = []
    mask = plan.block(r, st.step) if st.kernel else ()
    if mask != ():
        q, kv = part_len(st.q_part, L), part_len(st.kv_part, L)
        k = _block_ms(m, s, mask, q, kv, kernel) * (BWD_OVER_FWD if backward else 1)
        if backward:  # the stand-in (travelling blocks) and the dK/dV sums
            standin = q * h * 2 * d * e if st.step else 0
            mem += standin + 2 * kv * s.kv_heads * d * (2 * acc + e)
    if q_send:
        flows.append((st.q_send_to, part_len(st.q_send_part, L) * h * q_per))
    if plan.ret_send(r, st):
        flows.append((st.ret_send_to, part_len(st.ret_send_part, L) * h * ret_per))
    if ret_recv:  # the partial (dQ) that came home, summed
        rows_home = part_len(st.ret_recv_part, L) * h
        mem += rows_home * (d * (2 * acc + e) if backward else d * (e + 8) + 3 * 4)
    return (k, m.mem_ms(mem), flows)


def _rows(m: Machine, s: TrainShape, plan: WindowPlan, backward: bool, kernel: str):
    steps = len(plan.steps[0])
    return [[_rank_step(m, s, plan, r, plan.steps[r][t], backward, kernel)
             for r in range(plan.size)] for t in range(steps)]  # fmt: skip


def window_train_ms(
    m: Machine, s: TrainShape, ranks: list[int], window: int | None, split: str = ROW,
    band_kernel: str = BAND_KERNEL,
) -> dict:  # fmt: skip
    """Predicted GPU ms of one causal forward + backward TokenRing call with a window of
    `window` tokens (None: none) on the ring `ranks` (global ranks on `m`, two or more), and
    what it runs: `simulated`'s keys and "q_rows" (the most query rows a Q-lane message
    carries)."""
    n = len(ranks)
    if n < 2 or not s.causal:
        raise ValueError(f"a windowed ring call is causal over two or more ranks, got {n}")
    plan = plan_for(n, s.tokens, window, split)
    out = simulated(m, s, ranks, lambda backward: _rows(m, s, plan, backward, band_kernel))
    out["q_rows"] = q_rows(plan, s.tokens)
    return out


def simulated(m: Machine, s: TrainShape, ranks: list[int], rows_of) -> dict:
    """Both passes of a call whose rows `rows_of(backward)` gives, simulated on `ranks`:
    {"ms", "fwd_ms", "bwd_ms", "kernels_ms" (busiest rank), "comm_ms", "sent_mb" (the most one
    rank sends, both passes), "steps_run" (steps with a kernel), "kernels" (ranks' rows with a
    kernel, one pass)}."""
    n = len(ranks)
    out = {"kernels_ms": 0.0, "comm_ms": 0.0, "sent_mb": 0.0}
    for name, backward in (("fwd", False), ("bwd", True)):
        rows = rows_of(backward)
        ms, parts = _simulate(m, ranks, rows)
        out[f"{name}_ms"] = ms + _copies_ms(m, s, backward)
        out["kernels_ms"] += max(sum(row[i][0] for row in rows) for i in range(n))
        out["comm_ms"] += parts["comm"]
        out["sent_mb"] += max(sum(b for row in rows for _, b in row[i][2]) for i in range(n)) / 1e6
        if not backward:
            kernels = [sum(1 for r in range(n) if row[r][0] > 0) for row in rows]
            out["steps_run"], out["kernels"] = sum(1 for c in kernels if c), sum(kernels)
    out["ms"] = out["fwd_ms"] + out["bwd_ms"]
    return out


def q_rows(plan: WindowPlan, local: int) -> int:
    """The most query rows one Q-lane message of `plan` carries (shards of `local` tokens)."""
    sends = (
        part_len(st.q_send_part, local)
        for r in range(plan.size)
        for st, (send, _, _) in zip(plan.steps[r], plan.transfers(r), strict=True)
        if send
    )
    return max(sends, default=0)


def ulysses_window_ms(
    m: Machine, heads: int, kv_heads: int, head_dim: int, tokens: int, u: int,
    window: int | None, band_kernel: str = BAND_KERNEL,
) -> dict:  # fmt: skip
    """Predicted ms of one causal forward + backward ulysses call of degree `u` over `tokens`
    with a window of `window` tokens (None or >= tokens: none): {"ms" (GPU), "kernels_ms",
    "all_to_all_ms", "host_ms"}."""
    pred, _ = split_prediction(m, Workload(True, True), "ulysses", heads, head_dim, tokens, u,
                               1, kv_heads=kv_heads)  # fmt: skip
    kernels, a2a = pred.parts["kernels"], pred.parts["all_to_all"]
    if window is not None and window < tokens:
        h = heads // u  # the band kernel's rate over cuDNN's, times its share of the tiles
        rate = (m.table.block_ms(tokens, tokens, h, head_dim, kernel=band_kernel)
                / m.table.block_ms(tokens, tokens, h, head_dim))  # fmt: skip
        share = tile_share(tokens, tokens, 0, window - 1) / tile_share(tokens, tokens, 0, None)
        kernels *= rate * share
    return {"ms": kernels + a2a, "kernels_ms": kernels, "all_to_all_ms": a2a,
            "host_ms": pred.host_ms}  # fmt: skip


def pick_split(m: Machine, s: TrainShape, ranks: list[int], window: int | None) -> tuple[str, dict]:
    """(the split predicted faster, {split: ms}) for a windowed causal call on `ranks`."""
    ms = {split: window_train_ms(m, s, ranks, window, split)["ms"] for split in SPLITS}
    return min(SPLITS, key=ms.__getitem__), ms
