"""The kernel ceiling of a ring: what its block kernels alone allow, transfers and merges free.

    ceiling = (one-GPU time of the whole sequence / N) / (busiest rank's kernels-only time)

The blocks a rank runs come from the ring's own schedules (`rank_blocks`: the inference
forward's table with its held-back own block and last pieces, the zigzag / non-causal block
steps of training and causal calls, `documents.doc_plan` for packed documents), so the probe
(benchmarks/ceiling.py, which times them on one GPU) and the planner cannot drift from the code.

The planner predicts a ceiling from a split-block model fitted to the probe's measurements
(data/ceiling_*.json, written by benchmarks/derive_planner_data.py): one kernel call on a block
costs, in units of one attended (query, key) pair at the whole-sequence rate,

    pairs + lam * (q_len + kv_len) + mu

(`lam`: per-row costs - each query tile's CTA loads its Q and writes out/lse, the backward's
each key tile; `mu`: what a call pays whatever its size - launch and the last wave's tail).
The whole sequence is one such call, so small split blocks lose exactly those terms. A non-causal
forward without a fitted model is predicted from the calibration table's measured block times.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

from .calibration import DATA_DIR

__all__ = [
    "BlockRun",
    "SplitModel",
    "rank_blocks",
    "uses_block_steps",
    "fit_split_model",
    "kernel_ceiling",
    "load_models",
    "TRAIN_OVER_FORWARD",
    "CAUSAL_OVER_FULL",
]

# One-GPU cuDNN time of forward + backward over forward alone (full S x S), and of causal over
# full, both measured on one H200 at 32 heads x 128 (docs/benchmarks/
# training-ring2-ring4-h200-2026-11-26/train_ring1.json vs the calibration table's forward
# block: 28.4 / 6.91 ms at 16k, 111.5 / 27.5 at 32k; causal / full training 13.6 / 28.4 and
# 57.1 / 111.5). The planner's training predictions weigh the all-to-alls against kernels
# with them.
TRAIN_OVER_FORWARD = 4.08
CAUSAL_OVER_FULL = 0.49


@dataclass(frozen=True)
class BlockRun:
    """One kernel call of a rank: `q_len` held queries against `kv_len` local keys; `mask`: the
    causal flag or a block's document segments; `own`: the rank's own queries on its own K/V at
    step 0 (the backward reads the merged O there; elsewhere only delta travels)."""

    step: int
    q_len: int
    kv_len: int
    mask: object
    own: bool

    @property
    def pairs(self) -> float:
        """Attended (query, key) pairs."""
        if self.mask is True:
            return self.q_len * (self.q_len + 1) / 2
        if self.mask is False:
            return float(self.q_len * self.kv_len)
        return float(sum(s.pairs for s in self.mask))


def uses_block_steps(causal: bool, train: bool, packed: bool, windowed: bool = False) -> bool:
    """Whether the ring runs the call through the block loop (ring/seam/prepare: causal, grad,
    documents or a sliding window) rather than the inference forward (ring/inference/loop.py)."""
    return causal or train or packed or windowed


def rank_blocks(
    n: int, rank: int, tokens_per_rank: int, *, causal: bool, train: bool, docs=None,
    defer_own: float | None = None, final_chunks: int = 1, window=None, split: str = "zigzag",
) -> list[BlockRun]:  # fmt: skip
    """The kernel calls of `rank` in a ring of `n`, in the ring's order, from its schedules.
    docs: `ring.documents.Documents` of the whole sequence (n * tokens_per_rank tokens);
    defer_own / final_chunks: RingConfig's (the inference forward's own block and last pieces);
    window: flash-attn's `window_size` (left, right) (a causal window of W tokens is
    (W - 1, 0)): the blocks are the window plan's (ring/packed/window_plan.py: a block the
    window left alone keeps its causal flag, the others their segments, emptied ones are
    skipped); split: the window plan's shards of a causal call, "zigzag" or "contiguous"."""
    from ..ring.schedules.blocks import part_len
    from ..ring.schedules.window import Window

    t = tokens_per_rank
    win = Window.of(window, causal) if window is not None else None
    if win is None and split != "zigzag":
        raise ValueError(f"split={split!r} is a windowed call's; without a window: 'zigzag'")
    if not uses_block_steps(causal, train, docs is not None, win is not None):
        return _inference_blocks(n, rank, t, defer_own, final_chunks)
    plan, steps = _block_plan(n, rank, t, causal, docs, win, split)
    calls = []
    for st in steps:
        if not st.kernel:
            continue
        mask = st.causal if plan is None else plan.block(rank, st.step)
        if mask == ():  # documents or the window: nothing to attend, the ring skips the step
            continue
        q_len, kv_len = part_len(st.q_part, t), part_len(st.kv_part, t)
        calls.append(BlockRun(st.step, q_len, kv_len, mask, st.step == 0))
    return calls


def _inference_blocks(n: int, rank: int, t: int, defer_own, final_chunks: int) -> list[BlockRun]:
    """The inference forward's calls (non-causal, no grad, no documents, no window)."""
    from ..ring.schedules import NON_CAUSAL, chunk_bounds
    from ..ring.schedules import held_back as held_back_of

    if n == 1:  # local_forward: one call
        return [BlockRun(0, t, t, False, True)]
    held = held_back_of(t, defer_own)  # forward.py: the own block's tail runs last
    calls = []
    for st in NON_CAUSAL.steps(rank, n):
        if st.step == 0:
            calls.append(BlockRun(0, t - held, t, False, True))
        elif st.step < n - 1:
            calls.append(BlockRun(st.step, t, t, False, False))
        else:  # the last block in pieces, each sent home as it is done
            pieces = chunk_bounds(t, min(final_chunks, t))
            calls += [BlockRun(st.step, b - a, t, False, False) for a, b in pieces]
    if held:
        calls.append(BlockRun(0, held, t, False, True))
    return calls


def _block_plan(n: int, rank: int, t: int, causal: bool, docs, window, split: str):
    """(the call's plan or None, this rank's block steps): the window's plan (over the
    documents' if packed), the documents' plan, or the schedule's own steps."""
    from ..ring.schedules import CAUSAL_ZIGZAG, NON_CAUSAL_BLOCKS

    if window is not None:  # (ring/packed imports torch: only where a plan is asked for)
        from ..ring.packed.window_plan import window_plan

        plan = window_plan(window, causal, (t,) * n, split, docs)
        return plan, plan.steps[rank]
    schedule = CAUSAL_ZIGZAG if causal else NON_CAUSAL_BLOCKS
    if docs is None:
        return None, schedule.block_steps(rank, n)
    from ..ring.packed import doc_plan

    return doc_plan(docs, schedule, (t,) * n), schedule.block_steps(rank, n)


@dataclass(frozen=True)
class SplitModel:
    """Block cost in pair units: pairs + lam * (q_len + kv_len) + mu (module docstring)."""

    lam: float
    mu: float

    def cost(self, b: BlockRun) -> float:
        return b.pairs + self.lam * (b.q_len + b.kv_len) + self.mu

    def ceiling(self, ring: int, tokens: int, causal: bool, train: bool) -> float:
        return _model_ceiling(self, ring, tokens, causal, train)


@functools.lru_cache(maxsize=4096)
def _model_ceiling(model: SplitModel, ring: int, tokens: int, causal: bool, train: bool) -> float:
    if ring <= 1:
        return 1.0
    t = tokens // ring
    whole = sum(map(model.cost, rank_blocks(1, 0, t * ring, causal=causal, train=train)))
    busiest = max(
        sum(map(model.cost, rank_blocks(ring, r, t, causal=causal, train=train)))
        for r in _distinct_ranks(ring, causal)
    )
    return whole / ring / busiest


def _distinct_ranks(ring: int, causal: bool) -> range:
    # non-causal: every rank runs the same calls; zigzag: rank r has r back-half blocks
    return range(ring) if causal else range(1)


def fit_split_model(points: list[tuple[int, int, float]], causal: bool, train: bool) -> SplitModel:
    """The SplitModel whose ceilings fit measured (ring, tokens, ceiling) points (least squares;
    lam, mu >= 0). Needs scipy (the planner's dependency)."""
    from scipy.optimize import least_squares

    def residuals(p):
        model = SplitModel(float(p[0]), float(p[1]))
        return [_model_ceiling(model, n, s, causal, train) - c for n, s, c in points]

    fit = least_squares(
        residuals, [300.0, 1e5], bounds=([0, 0], [math.inf, math.inf]), x_scale="jac"
    )
    return SplitModel(round(float(fit.x[0]), 3), round(float(fit.x[1]), 1))


@dataclass(frozen=True)
class _Fit:
    mask: str
    pass_: str
    heads: int
    kv_heads: int
    head_dim: int
    model: SplitModel


@functools.lru_cache(maxsize=8)
def load_models(device_name: str = "NVIDIA H200") -> tuple[tuple[_Fit, ...], dict]:
    """The fitted split-block models for a GPU (data/ceiling_<gpu>.json; the H200's where that GPU
    has none) and the file's meta."""
    words = device_name.upper().replace("-", " ").split()
    model_name = next((w for w in words if any(c.isdigit() for c in w)), "")
    paths = sorted(DATA_DIR.glob("ceiling_*.json"))
    path = next((p for p in paths if model_name and model_name.lower() in p.stem), None)
    path = path or next((p for p in paths if "h200" in p.stem), None)
    if path is None:
        return (), {}
    data = json.loads(Path(path).read_text())
    fits = tuple(
        _Fit(f["mask"], f["pass"], f["heads"], f["kv_heads"], f["head_dim"],
             SplitModel(f["lam"], f["mu"]))
        for f in data["fits"]
    )  # fmt: skip
    return fits, {**data.get("meta", {}), "path": str(path)}


def _nearest_fit(mask: str, pass_: str, heads: int, kv_heads: int, head_dim: int, device_name):
    fits = [f for f in load_models(device_name)[0] if (f.mask, f.pass_) == (mask, pass_)]
    if not fits:
        return None
    return min(
        fits,
        key=lambda f: (
            abs(math.log(f.head_dim / head_dim)),
            abs(math.log(f.heads / heads)),
            abs(math.log((f.heads / f.kv_heads) / (heads / kv_heads))),
        ),
    )


def kernel_ceiling(
    mask: str, pass_: str, ring: int, tokens: int, heads: int = 32, kv_heads: int | None = None,
    head_dim: int = 128, device_name: str = "NVIDIA H200", table=None,
) -> tuple[float | None, str]:  # fmt: skip
    """(predicted ceiling, where it comes from) of a ring of `ring` over `tokens` global tokens.
    mask: "full" or "causal"; pass_: "fwd" or "fwd+bwd"; heads: per ring rank (after ulysses).
    table: a calibration KernelTable, for a non-causal forward without a fitted model. None when
    nothing measured covers this mask and pass (run benchmarks/ceiling.py)."""
    if ring <= 1:
        return 1.0, "no ring"
    kv_heads = kv_heads or heads
    causal, train = mask == "causal", pass_ == "fwd+bwd"
    fit = _nearest_fit(mask, pass_, heads, kv_heads, head_dim, device_name)
    if fit is not None:
        where = f"split-block model fitted to {fit.heads}/{fit.kv_heads} heads x {fit.head_dim}"
        return fit.model.ceiling(ring, tokens, causal, train), where
    if (mask, pass_) == ("full", "fwd") and table is not None:
        return _table_ceiling(table, ring, tokens, heads, head_dim), "calibration table"
    return None, f"no ceiling measured for {mask} {pass_}"


def _table_ceiling(table, ring: int, tokens: int, heads: int, head_dim: int) -> float:
    t = tokens // ring

    def ms(b: BlockRun) -> float:
        return table.block_ms(b.q_len, b.kv_len, heads, head_dim)

    whole = ms(BlockRun(0, t * ring, t * ring, False, True))
    return whole / ring / sum(map(ms, rank_blocks(ring, 0, t, causal=False, train=False)))
