"""Refit the packed-layout cost model (tokenring_xdit/ring/layout_cost.py) from one-GPU replays.

    python benchmarks/fit_layout_cost.py                  # the committed H200 replays -> the
                                                          # packaged table
    python benchmarks/fit_layout_cost.py --replays a.json b.json --out cost.json

--replays: benchmarks/packed_varlen.py's JSONs (--layout zigzag,documents[,auto]; several are
pooled, e.g. the committed rows and longer documents' rows): every rank of
every `replay_N[_layout]_flash_varlen` (the kernel a real packed ring runs on CUDA) is one sample,
its Work recomputed from the row's cu_seqlens and the layout its `work_N[_layout]` ran. The
output records the constants, the samples' residuals and their source, so the table can be
checked against the JSON it came from (tests/unit/test_layout_cost.py does).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenring_xdit.ring.documents import Documents, doc_plan
from tokenring_xdit.ring.layout_cost import DATA, TERMS, fit, plan_work
from tokenring_xdit.ring.schedules import CAUSAL_ZIGZAG

ROOT = Path(__file__).resolve().parent.parent
REPLAYS = "docs/benchmarks/packed_ring_h200/packed_varlen_layouts.json"
KERNEL, TILE = "flash_varlen", 128


def samples(report: dict, tile: int = TILE) -> list[tuple[str, object, float]]:
    """(label, Work, ms) for every replayed rank of `report`."""
    out = []
    for row in report["rows"]:
        cu = tuple(row["cu_seqlens"])
        total = cu[-1]
        for key, value in row.items():
            if not (key.startswith("replay_") and key.endswith("_" + KERNEL)):
                continue
            middle = key[len("replay_") : -len(KERNEL) - 1]  # "4" or "4_documents"
            n_text, _, tag = middle.partition("_")
            n = int(n_text)
            layout = row[f"work_{n}" + (f"_{tag}" if tag else "")]["layout"]
            q_lens = (total // n,) * n
            plan = doc_plan(Documents(cu), CAUSAL_ZIGZAG, q_lens, layout)
            for r, ms in enumerate(value["ranks_ms"]):
                label = f"{total} tokens N={n} {tag or 'zigzag'} rank {r}"
                out.append((label, plan_work(plan, q_lens, r, tile), ms))
    return out


def table(report: dict, source: str, tile: int = TILE) -> dict:
    """The cost table (as data/packed_layout_cost.json holds it) fitted on `report`."""
    found = samples(report, tile)
    cost = fit(((w, ms) for _, w, ms in found), tile, source)
    residuals = []
    for label, work, ms in found:
        pred = cost.ms(work)
        residuals.append({"rank": label, "work": work._asdict(), "ms": ms, "model_ms": pred})
    rel = [abs(x["model_ms"] - x["ms"]) / x["ms"] for x in residuals]
    return {
        "source": source,
        "meta": report.get("meta", {}),
        "kernel": KERNEL,
        "model": "ms = tile_ms*tiles + segment_ms*segments + call_ms*calls + row_ms*rows/1000",
        "terms": list(TERMS),
        "constants": {
            "tile": tile,
            "tile_ms": cost.tile_ms,
            "segment_ms": cost.segment_ms,
            "call_ms": cost.call_ms,
            "row_ms": cost.row_ms,
        },
        "fit": {
            "samples": len(rel),
            "max_rel_error": max(rel),
            "mean_rel_error": sum(rel) / len(rel),
        },
        "residuals": residuals,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--replays", nargs="+", default=[REPLAYS], help="packed_varlen.py's JSONs (one GPU)"
    )
    ap.add_argument("--out", default=str(DATA), help="where the table goes")
    args = ap.parse_args()
    reports = []
    for name in args.replays:
        path = Path(name)
        reports.append(json.loads((path if path.is_absolute() else ROOT / path).read_text()))
    pooled = {"meta": reports[0].get("meta", {}), "rows": [r for x in reports for r in x["rows"]]}
    out = table(pooled, ", ".join(args.replays))
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({"constants": out["constants"], "fit": out["fit"]}, indent=1))


if __name__ == "__main__":
    main()
