"""The packed-layout cost model `auto` picks with (ring/layout_cost.py) against the committed
H200 measurements: the packaged table is what benchmarks/fit_layout_cost.py derives from the
committed one-GPU replays, it reproduces every replayed rank, and on the committed real rings
(2 and 4 x H200) it picks the layout that ran faster. Then the model's own contracts: the
documents layout's Work from piece lengths equals the plan's, the choice is a pure function of
the documents (and the table), and a table that weighs only pairs is the old spread rule."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from tokenring_xdit.ring.doc_layout import DOCUMENTS, ROW, piece_pairs
from tokenring_xdit.ring.documents import (
    AUTO_MARGIN,
    Documents,
    _predicted,
    doc_plan,
    document_work,
    pick_layout,
)
from tokenring_xdit.ring.layout_cost import DATA, LayoutCost, Work, load, piece_work, plan_work
from tokenring_xdit.ring.schedules import CAUSAL_ZIGZAG, NON_CAUSAL_BLOCKS

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import fit_layout_cost  # noqa: E402

RESULTS = ROOT / "docs" / "benchmarks" / "packed_ring_h200"


def _json(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def test_the_packaged_table_is_the_fit_of_the_committed_replays():
    stored = json.loads(DATA.read_text())
    refit = fit_layout_cost.table(_json("packed_varlen_layouts.json"), stored["source"])
    for key, value in stored["constants"].items():
        assert refit["constants"][key] == pytest.approx(value, rel=1e-9), key
    assert load() == LayoutCost(**stored["constants"], source=stored["source"])
    assert stored["fit"]["samples"] == 36  # every rank of 2 rows x rings 2, 4 x 3 layouts
    assert all(v > 0 for v in stored["constants"].values())


def test_the_model_reproduces_every_replayed_rank():
    cost = load()
    found = fit_layout_cost.samples(_json("packed_varlen_layouts.json"))
    worst = max(abs(cost.ms(w) - ms) / ms for _, w, ms in found)
    assert worst <= 0.12, worst
    # pairs alone do not: the documents layout's balanced ranks replayed slower than the row
    # zigzag's worst rank (ring 4, 32k tokens: 24.6M pairs in ~12 ms vs 32.5M in 9.3 ms)
    by = {label: (w, ms) for label, w, ms in found}
    zig, doc = by["32768 tokens N=4 zigzag rank 3"], by["32768 tokens N=4 documents rank 3"]
    assert doc[1] > zig[1] and cost.ms(doc[0]) > cost.ms(zig[0])


def _real_rows():
    for name in ("packed_ring_2gpu.json", "packed_ring_4gpu.json"):
        yield from _json(name)["rows"]


@pytest.mark.parametrize("i", range(4))
def test_auto_picks_the_layout_that_ran_faster_on_the_real_rings(i):
    row = list(_real_rows())[i]
    ms = {k: row["methods"][k]["ms"] for k in (ROW, DOCUMENTS)}
    report = document_work(row["cu_seqlens"], row["ring"], causal=True)
    predicted = {k: report["layouts"][k]["predicted_ms"] for k in (ROW, DOCUMENTS)}
    measured_best = min(ms, key=ms.get)
    assert min(predicted, key=predicted.get) == measured_best, (ms, predicted)
    assert report["auto"] == measured_best
    # the pairs the benchmark recorded are the ones the report predicts from
    pairs = [r["pairs"] for r in report["layouts"][ROW]["ranks"]]
    assert pairs == row["methods"][ROW]["pairs_per_rank"]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("causal", [True, False])
def test_piece_work_equals_the_plans_work(n, causal):
    """auto predicts the documents layout from piece lengths (no segment made); tiles, segments
    and rows must equal the plan's, calls too when every document has >= 2N tokens."""
    rng = random.Random(97 * n + causal)
    schedule = CAUSAL_ZIGZAG if causal else NON_CAUSAL_BLOCKS
    for _ in range(40):
        total = 2 * n * rng.randint(1, 200)
        cuts = rng.sample(range(1, total), min(rng.randint(0, 12), total - 1))
        docs = Documents((0, *sorted(cuts), total))
        q_lens = (total // n,) * n
        plan = doc_plan(docs, schedule, q_lens, DOCUMENTS)
        tile = rng.choice([1, 4, 128])
        long = all(b - a >= 2 * n for a, b in zip(docs.bounds, docs.bounds[1:], strict=False))
        for r, fast in enumerate(piece_work(plan, q_lens, tile)):
            exact = plan_work(plan, q_lens, r, tile)
            assert (fast.tiles, fast.segments, fast.rows) == exact[:2] + (exact.rows,)
            if long:
                assert fast.calls == exact.calls, (docs, r, fast, exact)


def test_the_choice_is_a_pure_function_of_the_documents():
    """Every rank computes auto alone from the agreed documents: equal inputs, equal answer,
    whatever was cached before (the distributed test checks it across real ranks)."""
    rng = random.Random(5)
    rows = []
    for _ in range(20):
        total = 8 * rng.randint(64, 4096)
        cuts = rng.sample(range(1, total), rng.randint(0, 20))
        rows.append(Documents((0, *sorted(cuts), total)))
    first = [pick_layout(d, 4, True) for d in rows]
    _predicted.cache_clear()
    again = [pick_layout(Documents(tuple(d.bounds)), 4, True) for d in reversed(rows)]
    assert first == again[::-1]


# --- the model's direction: what moves the choice --------------------------------------------

PAIRS_ONLY = LayoutCost(tile=1, tile_ms=1e-6, segment_ms=0.0, call_ms=0.0, row_ms=0.0)


def test_a_table_of_pairs_only_is_the_spread_rule():
    """With tile 1 and no overheads the model counts pairs: auto then takes the documents
    layout exactly where its worst rank's pairs beat the row's by the margin."""
    rng = random.Random(8)
    for _ in range(30):
        n = rng.choice([2, 3, 4])
        total = 2 * n * rng.randint(4, 64)
        docs = Documents((0, *sorted(rng.sample(range(1, total), rng.randint(1, 8))), total))
        report = document_work(docs.bounds, n, cost=PAIRS_ONLY)
        row = max(r["pairs"] for r in report["layouts"][ROW]["ranks"])
        per_doc = max(piece_pairs(docs.bounds, n, True))
        want = DOCUMENTS if per_doc < row * (1 - AUTO_MARGIN) else ROW
        assert pick_layout(docs, n, True, cost=PAIRS_ONLY) == report["auto"] == want


def test_long_documents_pick_documents_short_ones_keep_the_zigzag():
    """Where kernel tiles dominate (two long documents, 64k tokens) the balance pays and auto
    cuts documents at rings 2 and 4; cutting many short documents into 2N pieces costs more
    (segments, calls) than the zigzag's imbalance saves (lognormal lengths, spread 1.7)."""
    two_long = [0, 40000, 65536]
    for n in (2, 4):
        report = document_work(two_long, n)
        assert report["auto"] == DOCUMENTS, report["layouts"][DOCUMENTS]["predicted_ms"]
    rng, cu = random.Random(2), [0]
    while cu[-1] < 131072:
        cu.append(min(131072, cu[-1] + max(1, int(rng.lognormvariate(6.5, 1.2)))))
    report = document_work(cu, 8)
    assert report["layouts"][ROW]["spread"] > 1.5 and report["auto"] == ROW


def test_work_adds_up():
    assert Work.total([Work(1, 2, 3, 4), Work(1, 1, 1, 1)]) == Work(2, 3, 4, 5)
    assert Work.total([]) == Work()
