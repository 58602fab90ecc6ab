"""What one ring rank's packed-documents block work costs in time: the model `auto` picks with
(docs/training-internals.md: the measurements behind it).

Attended (query, key) pairs alone mislead (pieces that partly fill kernel tiles, many segments,
two varlen calls per block), so a rank's forward + backward through a packed kernel is

    ms = tile_ms * tiles + segment_ms * segments + call_ms * calls + row_ms * rows / 1000

tiles: per segment the TILE x TILE tiles it covers (a causal diagonal t(t+1)/2, t = ceil(n/T));
segments: varlen entries; calls: one per run of abutting segments (`segments.segment_runs`);
rows: the query rows of every block that attends. `fresh_ms` adds cuDNN's per-shape plan builds
of a new packing over LAYERS_PER_PACKING calls (a training step packs a new batch); `ms` is the
call once the plans exist. Each packed kernel (`kernels.names.PRICED`) has its own constants,
fitted on the committed one-GPU replays (data/cost_model.json; benchmarks/fit_layout_cost.py
refits them). It ranks (layout, kernel) pairs, it does not promise ms; every rank uses this one
table (never a reading of its own GPU), so the choice is a function of the agreed documents.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import NamedTuple

from ..kernels.names import PRICED
from ..schedules.blocks import BACK, FRONT, part_len
from ..segments import Segment, segment_runs
from .doc_split import piece_lengths

__all__ = [
    "Work", "LayoutCost", "block_work", "plan_work", "piece_work", "load", "load_kernels", "fit",
    "DATA", "LAYERS_PER_PACKING",
]  # fmt: skip

DATA = Path(__file__).with_name("data") / "cost_model.json"
TERMS = ("tiles", "segments", "calls", "rows")
# calls that share one packing, over which a new packing's set-up is priced: the layers of a
# model (forward, then backward), a new packing at every step; 32 as in an 8B-parameter LLM
LAYERS_PER_PACKING = 32


class Work(NamedTuple):
    """One rank's block work in the model's terms (sums over its blocks)."""

    tiles: int = 0
    segments: int = 0
    calls: int = 0
    rows: int = 0

    @staticmethod
    def total(works: Iterable[Work]) -> Work:
        return Work(*(sum(x) for x in zip(Work(), *works, strict=False)))


def _tiles(s: Segment, tile: int) -> int:
    a = -(-(s.q1 - s.q0) // tile)
    return a * (a + 1) // 2 if s.causal else a * -(-(s.k1 - s.k0) // tile)


def block_work(segs: Sequence[Segment], q_rows: int, tile: int) -> Work:
    """The Work of one block: `segs` its segments (empty: skipped), `q_rows` its query tile."""
    if not segs:
        return Work()
    tiles = sum(_tiles(s, tile) for s in segs)
    return Work(tiles, len(segs), len(segment_runs(tuple(segs))), q_rows)


def _q_rows(st, q_lens: Sequence[int]) -> int:
    return part_len(st.q_part, q_lens[st.q_owner])


def plan_work(plan, q_lens: Sequence[int], rank: int, tile: int) -> Work:
    """Rank `rank`'s Work from its blocks in a `documents.DocPlan` (every segment made)."""
    return Work.total(
        block_work(plan.block(rank, t), _q_rows(st, q_lens), tile)
        for t, st in enumerate(plan.steps[rank][: plan.size])
    )


def _slots(owner: int, part: str, n: int) -> list[int]:
    front, back = owner, 2 * n - 1 - owner
    return [front] if part == FRONT else [back] if part == BACK else [front, back]


def _kind(a: int, b: int, causal: bool) -> bool | None:
    """Query slot a against key slot b: None (no pair), True (causal diagonal), False (full)."""
    if not causal or a > b:
        return False
    return True if a == b else None


def _calls(q_slots: list[int], k_slots: list[int], causal: bool) -> int:
    """Varlen calls of a documents-layout block whose pieces are all non-empty: one per
    (query slot, key slot) kind, less the kinds that continue a run (the next query slot
    against the next key slot with the same mask: segments.segment_runs joins them)."""
    kinds = {
        (i, j): k
        for i, a in enumerate(q_slots)
        for j, b in enumerate(k_slots)
        if (k := _kind(a, b, causal)) is not None
    }
    return len(kinds) - sum(kinds.get((i + 1, j + 1)) == k for (i, j), k in kinds.items())


def piece_work(plan, q_lens: Sequence[int], tile: int) -> list[Work]:
    """Every rank's Work in the documents layout from the piece lengths alone, O(documents x
    N) with no segment made (`shard`'s auto asks this for every new row). Tiles, segments and
    rows equal `plan_work`'s; calls are counted as if every piece were non-empty (exact when
    every document has >= 2N tokens; shorter ones leave gaps that split runs further).
    `plan`: the documents layout's DocPlan (its documents and schedule steps)."""
    n, causal = plan.size, plan.causal
    slots, tiles, segs = 2 * n, [0] * n, [0] * n
    held = [0] * slots  # per slot: a bit per document with a non-empty piece there
    for d, lens in enumerate(piece_lengths(plan.docs.bounds, n)):
        t = [-(-x // tile) for x in lens]
        later_t = list(accumulate(reversed(t), initial=0))[::-1]  # later_t[a]: slots >= a
        later_n = list(accumulate((x > 0 for x in reversed(lens)), initial=0))[::-1]
        for a, x in enumerate(lens):
            if x:
                held[a] |= 1 << d
        for r in range(n):
            for b in (r, slots - 1 - r):
                if not lens[b]:
                    continue
                if causal:  # key piece b meets query pieces a > b (full) and a == b (causal)
                    tiles[r] += t[b] * (t[b] + 1) // 2 + t[b] * later_t[b + 1]
                    segs[r] += 1 + later_n[b + 1]
                else:
                    tiles[r] += t[b] * later_t[0]
                    segs[r] += later_n[0]
    out = []
    for r in range(n):
        calls = rows = 0
        for st in plan.steps[r][:n]:
            qs, ks = _slots(st.q_owner, st.q_part, n), _slots(r, st.kv_part, n)
            pairs = [(a, b) for a in qs for b in ks if _kind(a, b, causal) is not None]
            if any(held[a] & held[b] for a, b in pairs):  # the block attends
                calls += _calls(qs, ks, causal)
                rows += _q_rows(st, q_lens)
        out.append(Work(tiles[r], segs[r], calls, rows))
    return out


@dataclass(frozen=True)
class LayoutCost:
    """The fitted constants (ms per unit of each term) and where they come from."""

    tile: int
    tile_ms: float
    segment_ms: float
    call_ms: float
    row_ms: float  # per 1000 query rows
    source: str = ""
    plan_ms: float = 0.0  # per segment of a new packing, per call: set-up / LAYERS_PER_PACKING

    def ms(self, work: Work) -> float:
        return (
            self.tile_ms * work.tiles
            + self.segment_ms * work.segments
            + self.call_ms * work.calls
            + self.row_ms * work.rows / 1000
        )

    def fresh_ms(self, work: Work) -> float:
        """`ms` on a new packing: with the kernel's per-shape set-up over the packing's calls."""
        return self.ms(work) + self.plan_ms * work.segments


@functools.lru_cache(maxsize=4)
def _table(path: str | None) -> tuple[tuple[str, LayoutCost], ...]:
    data = json.loads(Path(path or DATA).read_text())
    builds = data.get("plan_build_ms", {})
    out = []
    for name in PRICED:  # the packed kernels the table prices (kernels/names.py)
        c = data["kernels"][name]["constants"]
        cost = LayoutCost(
            int(c["tile"]), c["tile_ms"], c["segment_ms"], c["call_ms"], c["row_ms"],
            data["source"], builds.get(name, 0.0) / LAYERS_PER_PACKING,
        )  # fmt: skip
        out.append((name, cost))
    return tuple(out)


def load(path: str | None = None, kernel: str = PRICED[0]) -> LayoutCost:
    """One kernel's constants from the cost table (default: the packaged one)."""
    return dict(_table(path))[kernel]


def load_kernels(path: str | None = None) -> dict[str, LayoutCost]:
    """Every kernel's constants ({name: LayoutCost}, in `PRICED` order)."""
    return dict(_table(path))


def fit(samples: Iterable[tuple[Work, float]], tile: int, source: str = "") -> LayoutCost:
    """Least squares of the model on (Work, measured ms) samples, relative error weighted (a
    slow rank and a fast one count alike). ValueError if a constant comes out negative (the
    samples do not tell that term apart: measure more varied rows)."""
    import torch  # only to refit

    rows = [(w, ms) for w, ms in samples]
    a = torch.tensor([[*w[:3], w.rows / 1000] for w, _ in rows], dtype=torch.float64)
    y = torch.tensor([ms for _, ms in rows], dtype=torch.float64)
    sol = torch.linalg.lstsq(a / y[:, None], torch.ones_like(y), driver="gelsd").solution
    consts = [float(x) for x in sol]
    if min(consts) < 0:
        named = dict(zip(TERMS, consts, strict=True))
        raise ValueError(f"the fit gives a negative constant {named}")
    return LayoutCost(tile, *consts, source=source)
