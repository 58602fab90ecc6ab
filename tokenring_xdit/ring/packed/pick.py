"""Packed documents over the ring: what `auto` picks, (layout, kernel) by predicted time, and the
report of it.

Which (query, key) pairs of a block share a document, and the plan of a call (`Documents`,
`DocPlan`, `doc_plan`), are doc_blocks.py's (imported here: this is their public module).

A packed call runs in one of three layouts (the row's zigzag; every document cut in 2N pieces,
doc_layout.py; a causal row in N contiguous shards, schedules/contiguous.py) and, on CUDA in half
precision, through one of two exact kernels: `flash_varlen` (torch flash with cu_seqlens, one
call per run of segments) or `cudnn` (cuDNN once per segment).
Neither wins everywhere: measured on 4 x H200, cuDNN per segment runs the zigzag's few segments
per rank in ~0.6x flash_varlen's time and the documents layout's 63-252 segments 1.5-3x slower
(docs/benchmarks/packed-replays-h200-2026-11/). So every (layout, kernel) pair's slowest rank is
priced with that kernel's constants (layout_cost.py) and `auto` takes the fastest pair; another
layout (AUTO_LAYOUTS) only where it beats the row's best pair by AUTO_MARGIN (the model ranks from a
few measured rows; a near tie keeps the zigzag). The model prices kernels, not transfers: on
rows of many documents the contiguous layout, which moves the least, won by more than the
model says (4 x H200, docs/performance.md, packed training).

The layout is picked when `shard(..., layout="auto")` cuts the row (`pick_layout`, from the
documents and the ring's size: shard does not know the call's dtype, so it assumes every kernel
of the table); the kernel when the call is prepared (`pick_kernel`, for the layout the call
runs, among the kernels that work for its dtype and head size). Both are functions of agreed
values and the packaged table only (never a reading of the local GPU), so every rank picks
alike; the call's kernel record is part of the agreed header (its family).

`document_work` reports it all without running anything, with the dense causal ring's predicted
time beside it: the same row as ONE document (no mask), its zigzag blocks priced with cuDNN's
constants (the dense ring runs cuDNN; the cuDNN fit includes the whole row as one call). A pair
predicted slower than that is named in `slower_than_dense` (never switched to a dense call:
that would attend across documents).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from .documents import DocPlan, Documents, block_segments, doc_plan
from .doc_split import CONTIGUOUS, DOCUMENTS, LAYOUTS, ROW, Segment, check_total, normal_split
from ..kernels.names import PRICED, KernelName
from .cost import LayoutCost, Work, load_kernels, piece_work, plan_work

__all__ = [
    "Documents", "Segment", "DocPlan", "doc_plan", "block_segments", "PackedRow",
    "document_work", "pick", "pick_layout", "pick_kernel", "dense_ring_ms", "AUTO_MARGIN",
    "AUTO_LAYOUTS",
]  # fmt: skip

# another layout wins `auto` only where its best (layout, kernel) pair's slowest rank is predicted
# this much faster than the row's: the model ranks pairs from a few measured rows
# (layout_cost.py), so a near tie keeps the row's zigzag (fewer transfers: it skips the blocks
# of documents inside a chunk)
AUTO_MARGIN = 0.05
# the layouts `auto` chooses among (the row's zigzag first: the one a near tie keeps)
AUTO_LAYOUTS = (ROW, DOCUMENTS, CONTIGUOUS)

Costs = tuple[tuple[str, LayoutCost], ...]  # (kernel, its constants), in auto's tie order


class PackedRow(NamedTuple):
    """What a packed call's kernel choice depends on (all agreed by the input check): the
    documents, the ring's size, causality and the layout the call runs."""

    docs: Documents
    world_size: int
    causal: bool
    split: str

    def kernel(self, kernels: Sequence[str]) -> str:
        """The fastest of `kernels` predicted for this row (`pick_kernel`)."""
        return pick_kernel(self.docs, self.world_size, self.causal, self.split, kernels)


def _costs(cost, kernels: Sequence[str] | None = None) -> Costs:
    """cost: None (the packaged table, every kernel), one LayoutCost (a one-kernel table, priced
    as flash_varlen: the single-kernel form of before) or {kernel: LayoutCost}; `kernels`: the
    ones auto may pick (None: all of the table's)."""
    if cost is None:
        table = load_kernels()
    elif isinstance(cost, LayoutCost):
        table = {PRICED[0]: cost}
    else:
        table = dict(cost)
    chosen = tuple(table) if kernels is None else tuple(k for k in table if k in kernels)
    if not chosen:
        raise ValueError(f"no priced kernel in {list(kernels or ())}; the table has {list(table)}")
    return tuple((k, table[k]) for k in chosen)


def _schedule(causal: bool, split: str = ROW):
    from ..schedules import block_schedule

    return block_schedule(causal, split)


def _works(plan: DocPlan, q_lens: tuple[int, ...], tile: int) -> list[Work]:
    """Every rank's Work as the cost model sees it: the row's split from its blocks, the
    documents layout from its piece lengths (layout_cost.piece_work: no segment made)."""
    if plan.split == DOCUMENTS:
        return piece_work(plan, q_lens, tile)
    return [plan_work(plan, q_lens, r, tile) for r in range(len(q_lens))]


def _tile_works(plan: DocPlan, q_lens: tuple[int, ...], costs: Costs) -> dict[int, list[Work]]:
    """{tile: every rank's Work} for the tile sizes of `costs` (counted once per tile size)."""
    return {c.tile: _works(plan, q_lens, c.tile) for _, c in costs}


def _rank_ms(
    works: dict[int, list[Work]], costs: Costs, fresh: bool = False
) -> dict[str, list[float]]:
    """{kernel: every rank's predicted ms} from `_tile_works`; `fresh`: on a new packing (with
    the kernel's set-up, layout_cost.LayoutCost.fresh_ms)."""
    return {k: [c.fresh_ms(w) if fresh else c.ms(w) for w in works[c.tile]] for k, c in costs}


def _cuts(total: int, n: int, causal: bool, split: str) -> bool:
    """Whether `split` can cut a row of `total` tokens over `n` ranks (the row's split: in 2N
    zigzag chunks when causal over N > 1, else N shards; the documents layout: 2N pieces; the
    contiguous layout: N shards of a causal row over N > 1, the row's split otherwise)."""
    if split == ROW:
        return total % (2 * n if causal and n > 1 else n) == 0
    if split == CONTIGUOUS:
        return causal and n > 1 and total % n == 0
    return total % (2 * n) == 0


@functools.lru_cache(maxsize=128)
def _split_ms(docs: Documents, n: int, causal: bool, split: str, costs: Costs) -> dict:
    """{kernel: the slowest rank's predicted ms on a new packing} of one layout, or {} where it
    cannot cut (auto picks for a new packing: a training step's batch is one)."""
    if not _cuts(docs.total, n, causal, split):
        return {}
    q_lens = (docs.total // n,) * n
    plan = doc_plan(docs, _schedule(causal, split), q_lens, split)
    by_kernel = _rank_ms(_tile_works(plan, q_lens, costs), costs, fresh=True)
    return {k: max(ms) for k, ms in by_kernel.items()}


def _predicted(docs: Documents, n: int, causal: bool, costs: Costs) -> dict:
    """{layout: {kernel: the slowest rank's predicted ms}} of auto's layouts ({} where one
    cannot cut)."""
    return {split: _split_ms(docs, n, causal, split, costs) for split in AUTO_LAYOUTS}


def _best(by_kernel: Mapping[str, float]) -> tuple[str, float] | None:
    """The kernel of the smallest ms (the first on a tie), or None."""
    return min(by_kernel.items(), key=lambda x: x[1], default=None)


def _pick(predicted: dict) -> tuple[str, str]:
    """(layout, kernel): the fastest pair of another of AUTO_LAYOUTS where it beats the row's
    best by AUTO_MARGIN, else the row's split with its best kernel."""
    row = _best(predicted[ROW])
    others = [
        (split, found)
        for split in AUTO_LAYOUTS[1:]
        if (found := _best(predicted.get(split, {}))) is not None
    ]
    if others:
        split, (kernel, ms) = min(others, key=lambda x: x[1][1])
        if row is None or ms < row[1] * (1 - AUTO_MARGIN):
            return split, kernel
    return ROW, row[0] if row is not None else PRICED[0]


def pick(
    docs: Documents,
    world_size: int,
    causal: bool,
    cost=None,
    kernels: Sequence[str] | None = None,
) -> tuple[str, str]:
    """(layout, kernel) `auto` picks for `docs` over `world_size` ranks: the pair whose slowest
    rank is predicted fastest (module docstring), from the agreed documents and the table alone
    (`cost`: another table, e.g. refitted on other GPUs; every rank must pass the same;
    `kernels`: the ones that may run, default the table's)."""
    costs = _costs(cost, kernels)
    n = world_size
    if n == 1 or not _cuts(docs.total, n, causal, ROW):
        return ROW, pick_kernel(docs, n, causal, ROW, kernels, cost)
    return _pick(_predicted(docs, n, causal, costs))


def pick_layout(docs: Documents, world_size: int, causal: bool, cost=None) -> str:
    """The layout `shard(..., layout="auto")` cuts (`pick`'s, over every kernel of the table)."""
    return pick(docs, world_size, causal, cost)[0]


def pick_kernel(
    docs: Documents,
    world_size: int,
    causal: bool,
    split: str,
    kernels: Sequence[str] | None = None,
    cost=None,
) -> str:
    """The kernel `auto` runs a packed call of `docs` in layout `split` with: the one of
    `kernels` (those that work here; default the table's) whose slowest rank is predicted
    fastest. Rows the layout cannot cut (the input check names them) get the first one."""
    costs = _costs(cost, kernels)
    if world_size < 1 or not _cuts(docs.total, world_size, causal, split):
        return costs[0][0]
    found = _best(_split_ms(docs, world_size, causal, split, costs))
    return found[0] if found is not None else costs[0][0]


def dense_ring_ms(total: int, world_size: int, causal: bool = True, cost=None) -> float:
    """The dense ring's predicted slowest rank on a row of `total` tokens: the row as one
    document (no mask) in the row's split, priced with cuDNN's constants (the dense ring's
    kernel; a one-kernel table: its own)."""
    table = dict(_costs(cost))
    dense = table.get(KernelName.CUDNN.value) or next(iter(table.values()))
    n = world_size
    q_lens = (total // n,) * n
    plan = doc_plan(Documents((0, total)), _schedule(causal), q_lens)
    return max(dense.ms(w) for w in _works(plan, q_lens, dense.tile))


def _report(plan: DocPlan, q_lens: tuple[int, ...], costs: Costs) -> dict:
    """One layout's report. Per rank: pairs, blocks that run a kernel, segments, varlen calls,
    kernel tiles, predicted ms with the layout's best kernel (and with each), query transfers
    and returns; over the ranks: pairs, spread, the best kernel and the slowest rank's ms."""
    n = len(q_lens)
    tile_works = _tile_works(plan, q_lens, costs)
    by_kernel = _rank_ms(tile_works, costs)
    slowest = {k: max(ms) for k, ms in by_kernel.items()}
    fresh = {k: max(ms) for k, ms in _rank_ms(tile_works, costs, fresh=True).items()}
    kernel = _best(slowest)[0]
    works = tile_works[costs[0][1].tile]
    ranks = []
    for r, work in enumerate(works):
        blocks = [plan.block(r, t) for t in range(n)]
        ranks.append(
            {
                "pairs": sum(s.pairs for b in blocks for s in b),
                "kernel_calls": sum(1 for b in blocks if b),
                "segments": sum(len(b) for b in blocks),
                "varlen_calls": work.calls,
                "tiles": work.tiles,
                "predicted_ms": by_kernel[kernel][r],
                "predicted_ms_by_kernel": {k: ms[r] for k, ms in by_kernel.items()},
                "q_transfers": sum(plan.q_send(r, st) for st in plan.steps[r]),
                "returns": sum(plan.ret_send(r, st) for st in plan.steps[r]),
            }
        )
    pairs = [x["pairs"] for x in ranks]
    mean = sum(pairs) / len(pairs)
    return {
        "ranks": ranks,
        "pairs_total": sum(pairs),
        "spread": (max(pairs) / mean) if mean else 1.0,
        "kernel": kernel,
        "predicted_ms": slowest[kernel],
        "kernels": slowest,
        "kernels_new_packing": fresh,
    }


def document_work(
    cu_seqlens,
    world_size: int,
    causal: bool = True,
    layout: str = ROW,
    cost=None,
    kernels: Sequence[str] | None = None,
) -> dict:
    """Load-balance and time report of a packed sequence over a ring of `world_size` without
    running anything. Top level: the layout `layout` ("zigzag": the row's split, TokenRing's zigzag
    when causal and contiguous shards otherwise; "documents"; "contiguous": a causal row in N
    contiguous shards; "auto": the one `auto` picks): per rank the attended (query, key) pairs,
    kernel calls (blocks that attend), segments, varlen calls, kernel tiles, predicted ms (forward +
    backward, layout_cost.py) with the layout's fastest kernel ("predicted_ms") and with each
    ("predicted_ms_by_kernel"), query transfers and returns; the spread (max / mean pairs), that
    kernel ("kernel"), the slowest rank's predicted ms, each kernel's ("kernels"; with its plans
    built) and on a new packing ("kernels_new_packing": with cuDNN's plan builds over
    LAYERS_PER_PACKING calls), and the dense pairs it replaces.
    "layouts" holds the report of each layout (None where it cannot cut the row: the zigzag and the
    documents layout with T not a multiple of 2N, the contiguous layout of a row that is not
    causal); "auto" / "auto_kernel" the (layout, kernel) pair `auto` picks on CUDA in half precision
    (`pick`, for a new packing); "choices" every pair's predicted ms (both ways; fastest on a new
    packing first) and its ratio to "dense_ring_ms", the dense causal ring's predicted time on the
    same row (cuDNN, no mask); "slower_than_dense" the pairs predicted slower than it. `cost`: the
    table (default the packaged one; a single LayoutCost prices flash_varlen alone); `kernels`: the
    kernels auto may pick (default every one of the table: CUDA half precision where cuDNN
    works)."""
    docs, costs = Documents.of(cu_seqlens), _costs(cost, kernels)
    n, total = world_size, docs.total
    if layout not in (*LAYOUTS, "auto"):
        raise ValueError(f"layout must be one of {[*LAYOUTS, 'auto']}, got {layout!r}")
    layout = normal_split(layout, causal, n)  # ("auto" stays)
    if total % n or (layout != CONTIGUOUS and total % (2 * n if causal else n)):
        raise ValueError(f"{total} tokens do not split evenly over {n} ranks; pad the sequence")
    q_lens = (total // n,) * n
    layouts: dict = {}
    for split in LAYOUTS:
        layouts[split] = None
        if _cuts(total, n, causal, split):
            plan = doc_plan(docs, _schedule(causal, split), q_lens, split)
            layouts[split] = _report(plan, q_lens, costs)
    predicted = {k: (v["kernels"] if v else {}) for k, v in layouts.items()}
    fresh = {k: (v["kernels_new_packing"] if v else {}) for k, v in layouts.items()}
    if layouts[ROW] is None:  # only contiguous shards cut it; auto needs the zigzag (`pick`)
        auto, auto_kernel = ROW, PRICED[0]
    elif n > 1:
        auto, auto_kernel = _pick(fresh)  # (it reads AUTO_LAYOUTS' entries only)
    else:
        auto, auto_kernel = ROW, _best(fresh[ROW])[0]
    chosen = layouts[auto if layout == "auto" else layout]
    if chosen is None:
        check_total(total, n)
    dense_ms = dense_ring_ms(total, n, causal, cost)
    choices = [
        {"layout": split, "kernel": k, "predicted_ms": ms, "vs_dense": ms / dense_ms,
         "new_packing_ms": fresh[split][k]}
        for split, by in predicted.items()
        for k, ms in by.items()
    ]  # fmt: skip
    return {
        "documents": docs.count,
        "tokens": total,
        "layout": auto if layout == "auto" else layout,
        **chosen,
        "dense_pairs": total * (total + 1) // 2 if causal else total * total,
        "layouts": layouts,
        "auto": auto,
        "auto_kernel": auto_kernel,
        "choices": sorted(choices, key=lambda c: c["new_packing_ms"]),
        "dense_ring_ms": dense_ms,
        "slower_than_dense": [
            f"{c['layout']}/{c['kernel']}" for c in choices if c["predicted_ms"] > dense_ms
        ],
    }
