"""Packed documents over the ring: what `auto` picks, (layout, kernel) by predicted time
(docs/training-internals.md: the measurements).

A packed call runs in one of three layouts (the row's zigzag; the documents layout, doc_split.py;
a causal row in N contiguous shards) through one of two exact kernels (`flash_varlen`, one call
per run of segments; `cudnn`, once per segment). Neither wins everywhere, so every (layout,
kernel) pair's slowest rank is priced with that kernel's constants (cost.py) and `auto` takes the
fastest pair; another layout (AUTO_LAYOUTS) only where it beats the row's best pair by
AUTO_MARGIN (a near tie keeps the zigzag). The layout is picked when `shard(..., layout="auto")`
cuts the row (`pick_layout`: shard does not know the dtype, so it assumes every kernel of the
table), the kernels when the call is prepared (`kernel_order`). Both are functions of agreed
values and the packaged table only, so every rank picks alike.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

from ..kernels.names import PRICED, KernelName
from ..schedules import block_schedule
from .cost import LayoutCost, Work, load_kernels, piece_work, plan_work
from .doc_split import CONTIGUOUS, DOCUMENTS, ROW
from .documents import DocPlan, Documents, doc_plan

__all__ = [
    "pick", "pick_layout", "kernel_order", "dense_ring_ms", "AUTO_MARGIN",
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
    plan = doc_plan(docs, block_schedule(causal, split), q_lens, split)
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
        return ROW, kernel_order(docs, n, causal, ROW, kernels, cost)[0]
    return _pick(_predicted(docs, n, causal, costs))


def pick_layout(docs: Documents, world_size: int, causal: bool, cost=None) -> str:
    """The layout `shard(..., layout="auto")` cuts (`pick`'s, over every kernel of the table)."""
    return pick(docs, world_size, causal, cost)[0]


def kernel_order(
    docs: Documents,
    world_size: int,
    causal: bool,
    split: str,
    kernels: Sequence[str] | None = None,
    cost=None,
) -> tuple[str, ...]:
    """`kernels` (default the table's) by the slowest rank's predicted time on a new packing of
    `docs` in layout `split`, fastest first (the table's order on a tie, and where the layout
    cannot cut the row): a call's preparation prices them once, and `auto` runs the first that
    works for the call's dtype and head size."""
    costs = _costs(cost, kernels)
    names = tuple(k for k, _ in costs)
    if world_size < 1 or not _cuts(docs.total, world_size, causal, split):
        return names
    ms = _split_ms(docs, world_size, causal, split, costs)
    return tuple(sorted(names, key=lambda k: ms.get(k, float("inf"))))


def dense_ring_ms(total: int, world_size: int, causal: bool = True, cost=None) -> float:
    """The dense ring's predicted slowest rank on a row of `total` tokens: the row as one
    document (no mask) in the row's split, priced with cuDNN's constants (the dense ring's
    kernel; a one-kernel table: its own)."""
    table = dict(_costs(cost))
    dense = table.get(KernelName.CUDNN.value) or next(iter(table.values()))
    n = world_size
    q_lens = (total // n,) * n
    plan = doc_plan(Documents((0, total)), block_schedule(causal), q_lens)
    return max(dense.ms(w) for w in _works(plan, q_lens, dense.tile))
