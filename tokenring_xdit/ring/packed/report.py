"""`document_work`: the load-balance and time report of a packed row over a ring, without running
anything: per layout and rank the pairs, kernel calls, segments, predicted ms with each priced
kernel, the transfers; which (layout, kernel) pair `auto` picks (pick.py) and how each compares
with the dense causal ring on the same row (a pair predicted slower than it is named in
`slower_than_dense`; it is never switched to a dense call: that would attend across documents).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..schedules import block_schedule
from ..kernels.names import PRICED
from .doc_split import CONTIGUOUS, LAYOUTS, ROW, check_total, normal_split
from .documents import DocPlan, Documents, doc_plan
from .pick import Costs, _best, _costs, _cuts, _pick, _rank_ms, _tile_works, dense_ring_ms

__all__ = ["document_work"]


def _rank_report(plan: DocPlan, r: int, work, by_kernel: dict, kernel: str) -> dict:
    """Rank r's line: pairs, blocks that run a kernel, segments, varlen calls, kernel tiles,
    predicted ms (with the layout's best kernel and with each), query transfers and returns."""
    blocks = [plan.block(r, t) for t in range(plan.size)]
    return {
        "pairs": sum(s.pairs for b in blocks for s in b), "kernel_calls": sum(map(bool, blocks)),
        "segments": sum(map(len, blocks)), "varlen_calls": work.calls, "tiles": work.tiles,
        "predicted_ms": by_kernel[kernel][r],
        "predicted_ms_by_kernel": {k: ms[r] for k, ms in by_kernel.items()},
        "q_transfers": sum(plan.q_send(r, st) for st in plan.steps[r]),
        "returns": sum(plan.ret_send(r, st) for st in plan.steps[r]),
    }  # fmt: skip


def _report(plan: DocPlan, q_lens: tuple[int, ...], costs: Costs) -> dict:
    """One layout's report: every rank's line; over the ranks: pairs, spread, the best kernel
    and the slowest rank's ms (with each kernel, and on a new packing)."""
    tile_works = _tile_works(plan, q_lens, costs)
    by_kernel = _rank_ms(tile_works, costs)
    slowest = {k: max(ms) for k, ms in by_kernel.items()}
    fresh = {k: max(ms) for k, ms in _rank_ms(tile_works, costs, fresh=True).items()}
    kernel = _best(slowest)[0]
    works = tile_works[costs[0][1].tile]
    ranks = [_rank_report(plan, r, w, by_kernel, kernel) for r, w in enumerate(works)]
    pairs = [x["pairs"] for x in ranks]
    mean = sum(pairs) / len(pairs)
    return {
        "ranks": ranks, "pairs_total": sum(pairs), "spread": (max(pairs) / mean) if mean else 1.0,
        "kernel": kernel, "predicted_ms": slowest[kernel], "kernels": slowest,
        "kernels_new_packing": fresh,
    }  # fmt: skip


def _checked(layout: str, total: int, n: int, causal: bool) -> str:
    """`layout` as the row runs it (ValueError for an unknown one or a row it cannot cut)."""
    if layout not in (*LAYOUTS, "auto"):
        raise ValueError(f"layout must be one of {[*LAYOUTS, 'auto']}, got {layout!r}")
    layout = normal_split(layout, causal, n)  # ("auto" stays)
    if total % n or (layout != CONTIGUOUS and total % (2 * n if causal else n)):
        raise ValueError(f"{total} tokens do not split evenly over {n} ranks; pad the sequence")
    return layout


def _auto(layouts: dict, n: int) -> tuple[str, str]:
    """(layout, kernel) `auto` picks from the layouts' reports (on a new packing)."""
    fresh = {k: (v["kernels_new_packing"] if v else {}) for k, v in layouts.items()}
    if layouts[ROW] is None:  # only contiguous shards cut it; auto needs the zigzag (`pick`)
        return ROW, PRICED[0]
    return _pick(fresh) if n > 1 else (ROW, _best(fresh[ROW])[0])


def _choices(layouts: dict, dense_ms: float) -> list[dict]:
    """Every (layout, kernel) pair's predicted ms, in the layouts' and kernels' order."""
    return [
        {"layout": split, "kernel": k, "predicted_ms": ms, "vs_dense": ms / dense_ms,
         "new_packing_ms": report["kernels_new_packing"][k]}
        for split, report in layouts.items() if report
        for k, ms in report["kernels"].items()
    ]  # fmt: skip


def document_work(
    cu_seqlens,
    world_size: int,
    causal: bool = True,
    layout: str = ROW,
    cost=None,
    kernels: Sequence[str] | None = None,
) -> dict:
    """The report of the packed row `cu_seqlens` over `world_size` ranks in `layout` ("zigzag":
    the row's split; "documents"; "contiguous"; "auto": `auto`'s pick), top level (`_report`'s
    fields), with "layouts" (every layout's report, None where it cannot cut the row), "auto" /
    "auto_kernel" (`pick`'s pair for a new packing), "choices" (every pair's ms and its ratio to
    "dense_ring_ms"), "slower_than_dense" and "dense_pairs". `cost`: the table (default the
    packaged one; one LayoutCost prices flash_varlen alone); `kernels`: those auto may pick."""
    docs, costs = Documents.of(cu_seqlens), _costs(cost, kernels)
    n, total = world_size, docs.total
    layout = _checked(layout, total, n, causal)
    q_lens = (total // n,) * n
    layouts = {
        split: _report(doc_plan(docs, block_schedule(causal, split), q_lens, split), q_lens, costs)
        if _cuts(total, n, causal, split) else None
        for split in LAYOUTS
    }  # fmt: skip
    auto, auto_kernel = _auto(layouts, n)
    chosen = layouts[auto if layout == "auto" else layout]
    if chosen is None:
        check_total(total, n)
    dense_ms = dense_ring_ms(total, n, causal, cost)
    choices = _choices(layouts, dense_ms)
    return {
        "documents": docs.count, "tokens": total, "layout": auto if layout == "auto" else layout,
        **chosen, "dense_pairs": total * (total + 1) // 2 if causal else total * total,
        "layouts": layouts, "auto": auto, "auto_kernel": auto_kernel,
        "choices": sorted(choices, key=lambda c: c["new_packing_ms"]),
        "dense_ring_ms": dense_ms,
        "slower_than_dense": [
            f"{c['layout']}/{c['kernel']}" for c in choices if c["predicted_ms"] > dense_ms
        ],
    }  # fmt: skip
