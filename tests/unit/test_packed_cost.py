"""The packed cost model `auto` picks with (ring/packed/cost.py, ring/packed/pick.py) against the
committed H200 measurements: the packaged table is what benchmarks/fit_layout_cost.py derives
from the committed one-GPU replays (one set of constants per kernel), it reproduces every
replayed rank, and on every committed real ring (2 and 4 x H200) it ranks the (layout, kernel)
pairs that ran as they ran. Then the model's own contracts: the documents layout's Work from
piece lengths equals the plan's, the choice is a pure function of the documents (and the
table), and a table that weighs only pairs is the old spread rule."""

from __future__ import annotations

import dataclasses
import json
import random
import statistics
import sys
from pathlib import Path

import pytest

from tokenring_xdit.ring.packed import pick as documents
from tokenring_xdit.ring.packed.doc_split import CONTIGUOUS, DOCUMENTS, LAYOUTS, ROW, piece_pairs
from tokenring_xdit.ring.packed import Documents, doc_plan, document_work, pick_layout
from tokenring_xdit.ring.packed.pick import AUTO_MARGIN
from tokenring_xdit.ring.packed.cost import (
    DATA,
    LAYERS_PER_PACKING,
    LayoutCost,
    Work,
    load,
    load_kernels,
    piece_work,
    plan_work,
)
from tokenring_xdit.ring.kernels import names
from tokenring_xdit.ring.schedules import CAUSAL_ZIGZAG, NON_CAUSAL_BLOCKS

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import fit_layout_cost  # noqa: E402

RESULTS = ROOT / "docs" / "benchmarks" / "packed-replays-h200-2026-11"


def _json(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def test_the_packaged_table_is_the_fit_of_the_committed_replays():
    stored = json.loads(DATA.read_text())
    refit = fit_layout_cost.table(_json("packed_varlen_layouts.json"), stored["source"])
    assert list(stored["kernels"]) == list(names.PRICED)  # the registry's priced kernels
    for kernel in names.PRICED:
        constants = stored["kernels"][kernel]["constants"]
        for key, value in constants.items():
            got = refit["kernels"][kernel]["constants"][key]
            assert got == pytest.approx(value, rel=1e-9), (kernel, key)
        plan = stored["plan_build_ms"][kernel] / LAYERS_PER_PACKING
        assert load(kernel=kernel) == LayoutCost(**constants, source=stored["source"], plan_ms=plan)
        assert load_kernels()[kernel] == load(kernel=kernel)
        assert all(v > 0 for v in constants.values())
    # every rank of 2 rows x rings 2, 4 x 3 layouts, and the ring of one per row; cuDNN also
    # the whole row as one call (what the dense ring is priced with)
    assert stored["kernels"]["flash_varlen"]["fit"]["samples"] == 38
    assert stored["kernels"]["cudnn"]["fit"]["samples"] == 40
    # cuDNN per segment: a segment costs ~8x flash_varlen's, a tile about half
    flash, cudnn = load(kernel="flash_varlen"), load(kernel="cudnn")
    assert cudnn.segment_ms > 5 * flash.segment_ms and cudnn.tile_ms < 0.6 * flash.tile_ms


@pytest.mark.parametrize(("kernel", "worst", "median"), [("flash_varlen", 0.12, 0.05),
                                                          ("cudnn", 0.35, 0.09)])  # fmt: skip
def test_the_model_reproduces_every_replayed_rank(kernel, worst, median):
    """Within 12% for flash_varlen; cuDNN per segment within 35% (its replays of the documents
    layout, 63-252 segment calls per rank, vary up to 46% between two runs of the same ranks)."""
    cost = load(kernel=kernel)
    found = fit_layout_cost.samples(_json("packed_varlen_layouts.json"), kernel=kernel)
    errors = [abs(cost.ms(w) - ms) / ms for _, w, ms in found]
    assert max(errors) <= worst and statistics.median(errors) <= median, errors
    # pairs alone do not: the documents layout's balanced ranks replayed slower than the row
    # zigzag's worst rank (ring 4, 32k tokens: 24.6M pairs in ~12 ms vs 32.5M in 9.3 ms)
    by = {label: (w, ms) for label, w, ms in found}
    zig, doc = by["32768 tokens N=4 zigzag rank 3"], by["32768 tokens N=4 documents rank 3"]
    assert doc[1] > zig[1] and cost.ms(doc[0]) > cost.ms(zig[0])


PRICED = {"flash_varlen": "flash_varlen", "cudnn+segments": "cudnn"}  # record -> table kernel
BEFORE = {"auto": "flash_varlen", "cudnn": "cudnn+segments"}  # --kernel -> the record it ran


def _measured() -> dict:
    """{(cu_seqlens, ring): {(layout, kernel): ms}} over every committed real ring. An entry
    names its layout (`L` or `L/K`; "auto" layouts repeat one and are left out) and, in later
    runs, the record that ran (`kernel_used`); before, the file's --kernel said it (its
    "auto" was flash_varlen then). A pair measured twice keeps its first entry."""
    rows: dict = {}
    for path in sorted(RESULTS.glob("packed_ring_*.json")):
        data = json.loads(path.read_text())
        meta = data["meta"].get("kernel", "auto")
        for row in data["rows"]:
            found = rows.setdefault((tuple(row["cu_seqlens"]), row["ring"]), {})
            for name, entry in row["methods"].items():
                layout = name.partition("/")[0]
                used = entry.get("kernel_used") or BEFORE.get(meta, meta)
                if layout in LAYOUTS and used in PRICED:
                    found.setdefault((layout, PRICED[used]), entry["ms"])
    return rows


MEASURED = _measured()
COMPARED = sorted(k for k, v in MEASURED.items() if len(v) > 1)


def test_every_committed_real_ring_is_compared():
    # ring 2: 32k, 128k; ring 4: 32k, 128k, long documents 64k, 128k (ring 4: both kernels)
    assert len(COMPARED) == 6
    assert sum(len(MEASURED[k]) >= 4 for k in COMPARED) == 4
    # ring 4, 32k and 128k: the contiguous layout too, both kernels
    assert sum(len(MEASURED[k]) == 6 for k in COMPARED) == 2


@pytest.mark.parametrize("key", COMPARED, ids=lambda k: f"{k[0][-1]}-{len(k[0]) - 1}docs-N{k[1]}")
def test_auto_picks_the_pair_that_ran_fastest_on_the_real_rings(key):
    """Among the (layout, kernel) pairs measured on a row the model ranks them as they ran, and
    auto's rule over them picks the fastest, or one within its margin of it (the rule keeps the
    zigzag unless the documents layout is predicted AUTO_MARGIN faster: on 64k in 2 documents
    the two cuDNN pairs ran 42.73 / 42.84 ms); where both kernels ran (ring 4) that is cuDNN per
    segment on a row's few segments, and auto picks it among all pairs. On a new packing (a
    training step) auto picks flash_varlen on rows of many documents, in the layout that ran
    fastest with it (the contiguous layout at ring 4: 9.31 / 27.06 ms against the zigzag's
    11.28 / 33.43, 4 x H200), cuDNN on a few long ones."""
    cu, n = key
    ms = MEASURED[key]
    report = document_work(list(cu), n, causal=True)
    predicted = {(lay, k): report["layouts"][lay]["kernels"][k] for lay, k in ms}
    assert sorted(ms, key=ms.get) == sorted(predicted, key=predicted.get), (ms, predicted)
    restricted = {lay: {k: v for (y, k), v in predicted.items() if y == lay} for lay in LAYOUTS}
    assert ms[documents._pick(restricted)] <= (1 + documents.AUTO_MARGIN) * min(ms.values())
    if len(ms) >= 4:  # the pairs ran a packing again and again: cuDNN's plans were built
        assert report["layouts"][ROW]["kernel"] == "cudnn"
        # for a new packing (a training step) auto prices the plan builds: with many documents
        # (many segment shapes) flash_varlen, with a few long ones cuDNN still
        kernel = "flash_varlen" if len(cu) - 1 > 4 else "cudnn"
        assert report["auto_kernel"] == kernel
        ran = {lay: v for (lay, k), v in ms.items() if k == kernel}
        assert ran[report["auto"]] <= (1 + documents.AUTO_MARGIN) * min(ran.values()), ran
        if len(cu) > 8:  # many documents: 63-252 segments per rank in the documents layout
            assert report["layouts"][DOCUMENTS]["kernel"] == "flash_varlen"
    # the pairs the benchmark recorded are the ones the report predicts from
    for name in _ring_files():
        for row in _json(name)["rows"]:
            for name, entry in row["methods"].items():
                if (tuple(row["cu_seqlens"]), row["ring"]) == key and name.startswith(ROW):
                    pairs = [r["pairs"] for r in report["layouts"][ROW]["ranks"]]
                    assert pairs == entry["pairs_per_rank"]


def _ring_files() -> list[str]:
    return [p.name for p in sorted(RESULTS.glob("packed_ring_*.json"))]


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
    first = [documents.pick(d, 4, True) for d in rows]
    documents._split_ms.cache_clear()
    again = [documents.pick(Documents(tuple(d.bounds)), 4, True) for d in reversed(rows)]
    assert first == again[::-1]
    assert [pick_layout(d, 4, True) for d in rows] == [x[0] for x in first]


# --- the model's direction: what moves the choice --------------------------------------------

PAIRS_ONLY = LayoutCost(tile=1, tile_ms=1e-6, segment_ms=0.0, call_ms=0.0, row_ms=0.0)


def test_a_table_of_pairs_only_is_the_spread_rule():
    """With tile 1 and no overheads the model counts pairs: auto then takes the layout of the
    fewest pairs on its worst rank (documents or contiguous) exactly where they beat the row's
    by the margin."""
    rng = random.Random(8)
    for _ in range(30):
        n = rng.choice([2, 3, 4])
        total = 2 * n * rng.randint(4, 64)
        docs = Documents((0, *sorted(rng.sample(range(1, total), rng.randint(1, 8))), total))
        report = document_work(docs.bounds, n, cost=PAIRS_ONLY)
        row = max(r["pairs"] for r in report["layouts"][ROW]["ranks"])
        worst = {
            DOCUMENTS: max(piece_pairs(docs.bounds, n, True)),
            CONTIGUOUS: max(r["pairs"] for r in report["layouts"][CONTIGUOUS]["ranks"]),
        }
        best = min(worst, key=worst.get)
        want = best if worst[best] < row * (1 - AUTO_MARGIN) else ROW
        assert pick_layout(docs, n, True, cost=PAIRS_ONLY) == report["auto"] == want


def test_long_documents_pick_documents_short_ones_keep_the_zigzag():
    """Where kernel tiles dominate (two long documents, 64k tokens) the balance pays: with
    flash_varlen alone auto cuts documents at rings 2 and 4. cuDNN per segment runs both layouts'
    few segments ~2x faster still, so auto takes it; the documents layout keeps its lead at ring
    2 and ties the zigzag at ring 4 (within AUTO_MARGIN: the zigzag). Cutting many short
    documents into 2N pieces costs more (segments, calls) than the zigzag's imbalance saves
    (lognormal lengths, spread 1.7). Where documents are short against a shard, contiguous
    shards hold them whole (one varlen call per rank, a hop of a few rows for the one that
    crosses into the shard before): auto takes that layout, with flash_varlen; the long
    documents keep the zigzag or the documents layout (contiguous shards of a 40k document
    load its first ranks: predicted 1.17x slower at ring 2, 1.50x at ring 4)."""
    two_long = [0, 40000, 65536]
    for n in (2, 4):
        report = document_work(two_long, n, kernels=("flash_varlen",))
        assert report["auto"] == DOCUMENTS, report["layouts"][DOCUMENTS]["predicted_ms"]
    # with cuDNN's plans built the documents layout's balance wins at ring 2; on a new packing
    # its 2N pieces per document are new shapes to plan, and the zigzag keeps cuDNN's lead
    warm = {k: dataclasses.replace(c, plan_ms=0.0) for k, c in load_kernels().items()}
    assert documents.pick(Documents(tuple(two_long)), 2, True, cost=warm) == (DOCUMENTS, "cudnn")
    assert documents.pick(Documents(tuple(two_long)), 2, True) == (ROW, "cudnn")
    report = document_work(two_long, 4)
    assert (report["auto"], report["auto_kernel"]) == (ROW, "cudnn")
    per_doc = report["layouts"][DOCUMENTS]["kernels"]["cudnn"]
    assert report["predicted_ms"] < per_doc < report["predicted_ms"] / (1 - AUTO_MARGIN)
    rng, cu = random.Random(2), [0]
    while cu[-1] < 131072:
        cu.append(min(131072, cu[-1] + max(1, int(rng.lognormvariate(6.5, 1.2)))))
    report = document_work(cu, 8)
    assert report["layouts"][ROW]["spread"] > 1.5 and report["auto"] == CONTIGUOUS
    rng, cu = random.Random(0), [0]  # 145 documents of 50-400 tokens: ~40 segments per rank
    while cu[-1] < 32768:
        cu.append(min(32768, cu[-1] + rng.randint(50, 400)))
    for n in (2, 4, 8):
        assert documents.pick(Documents(tuple(cu)), n, True) == (CONTIGUOUS, "flash_varlen")
        report = document_work(cu, n)
        assert [r["q_transfers"] for r in report["layouts"][CONTIGUOUS]["ranks"]] == [0] + [1] * (
            n - 1
        )
    for n, slower in ((2, 1.15), (4, 1.45)):  # the long documents never go to contiguous shards
        report = document_work(two_long, n)
        assert report["layouts"][CONTIGUOUS]["predicted_ms"] > slower * report["predicted_ms"]


def _dense_measured(key) -> float:
    for name in _ring_files():
        for row in _json(name)["rows"]:
            if (tuple(row["cu_seqlens"]), row["ring"]) == key:
                return row["methods"]["dense_causal"]["ms"]
    raise AssertionError(key)


@pytest.mark.parametrize("key", sorted(MEASURED), ids=lambda k: f"{k[0][-1]}-N{k[1]}")
def test_the_report_names_the_pairs_that_ran_slower_than_the_dense_ring(key):
    """The dense causal ring on the same row (cuDNN, no mask) is the bar: the report's
    `slower_than_dense` names exactly the measured pairs that ran slower than it (ring 4, 32k:
    documents through cuDNN per segment; two long documents, 64k: both flash_varlen layouts)."""
    report = document_work(list(key[0]), key[1], causal=True)
    dense = _dense_measured(key)
    for (layout, kernel), ms in MEASURED[key].items():
        named = f"{layout}/{kernel}" in report["slower_than_dense"]
        assert named == (ms > dense), (layout, kernel, ms, dense, report["dense_ring_ms"])
    assert report["dense_ring_ms"] == documents.dense_ring_ms(key[0][-1], key[1])
    assert 0.8 < report["dense_ring_ms"] / dense < 1.0  # compute only: the ring adds transfers


def test_work_adds_up():
    assert Work.total([Work(1, 2, 3, 4), Work(1, 1, 1, 1)]) == Work(2, 3, 4, 5)
    assert Work.total([]) == Work()
