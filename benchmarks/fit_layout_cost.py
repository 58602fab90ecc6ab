"""Refit the packed-layout cost model (tokenring_xdit/ring/packed/cost.py) from one-GPU replays.

    python benchmarks/fit_layout_cost.py                  # the committed H200 replays -> the
                                                          # packaged table
    python benchmarks/fit_layout_cost.py --replays a.json b.json --out cost.json

--replays: benchmarks/packed_varlen.py's JSONs (--layout zigzag,documents[,auto]; several are
pooled, e.g. the committed rows and longer documents' rows). Each kernel of the table
(`kernels.names.PRICED`) is fitted on its own samples: every rank of every
`replay_N[_layout]_<pair>` (`flash_varlen`, or `cudnn+segments` for `cudnn`), its Work
recomputed from the row's cu_seqlens and the layout its `work_N[_layout]` ran; the ring of one
(`ring1_<pair>`: the whole row as one block); and for cuDNN the whole row as one causal call
(`dense_causal`: SDPA cuDNN, the row as a single segment, which anchors cuDNN's tile rate on
large blocks: the dense causal ring `document_work` reports is priced with it). The output
records each kernel's constants, its samples' residuals and their source, so the table can be
checked against the JSON it came from (tests/unit/test_packed_cost.py does).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from tokenring_xdit.ring.packed import Documents, doc_plan
from tokenring_xdit.ring.kernels.names import PRICED
from tokenring_xdit.ring.packed.cost import DATA, TERMS, fit, plan_work
from tokenring_xdit.ring.schedules import block_schedule

ROOT = Path(__file__).resolve().parent.parent
REPLAYS = "docs/benchmarks/packed-replays-h200-2026-11/packed_varlen_layouts.json"
# where, when and on what code the committed replays ran (docs/benchmarks/README.md)
MEASURED = {REPLAYS: {"machine": "one H200 of 4 x H200, torch 2.11.0+cu130", "date": "2026-11-26",
                      "commit": "92787d1"}}  # fmt: skip
TILE = 128
# the table's kernel -> the name of its pair in packed_varlen.py's keys
PAIRS = {"flash_varlen": "flash_varlen", "cudnn": "cudnn+segments"}


def _rank_work(cu: tuple[int, ...], n: int, layout: str, tile: int) -> list:
    q_lens = (cu[-1] // n,) * n
    plan = doc_plan(Documents(cu), block_schedule(True, layout), q_lens, layout)
    return [plan_work(plan, q_lens, r, tile) for r in range(n)]


def samples(
    report: dict, tile: int = TILE, kernel: str = "flash_varlen"
) -> list[tuple[str, object, float]]:
    """(label, Work, ms) for every replayed rank of `report` run with `kernel`, its ring of
    one and (cuDNN) its whole row as one call."""
    pair, out = PAIRS[kernel], []
    for row in report["rows"]:
        cu = tuple(row["cu_seqlens"])
        total = cu[-1]
        for key, value in row.items():
            if not (key.startswith("replay_") and key.endswith("_" + pair)):
                continue
            middle = key[len("replay_") : -len(pair) - 1]  # "4" or "4_documents"
            n_text, _, tag = middle.partition("_")
            n = int(n_text)
            layout = row[f"work_{n}" + (f"_{tag}" if tag else "")]["layout"]
            works = _rank_work(cu, n, layout, tile)
            for r, ms in enumerate(value["ranks_ms"]):
                out.append((f"{total} tokens N={n} {tag or 'zigzag'} rank {r}", works[r], ms))
        if isinstance(row.get(f"ring1_{pair}"), float):
            out.append((f"{total} tokens N=1", _rank_work(cu, 1, "zigzag", tile)[0],
                        row[f"ring1_{pair}"]))  # fmt: skip
        if kernel == "cudnn" and isinstance(row.get("dense_causal"), float):
            whole = _rank_work((0, total), 1, "zigzag", tile)[0]
            out.append((f"{total} tokens as one causal call", whole, row["dense_causal"]))
    return out


def kernel_table(report: dict, kernel: str, source: str, tile: int = TILE) -> dict:
    """One kernel's entry of the table: constants, the fit's errors, every sample's residual."""
    found = samples(report, tile, kernel)
    cost = fit(((w, ms) for _, w, ms in found), tile, source)
    residuals = []
    for label, work, ms in found:
        pred = cost.ms(work)
        residuals.append({"rank": label, "work": work._asdict(), "ms": ms, "model_ms": pred})
    rel = [abs(x["model_ms"] - x["ms"]) / x["ms"] for x in residuals]
    return {
        "pair": PAIRS[kernel],
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
            "median_rel_error": statistics.median(rel),
            "mean_rel_error": sum(rel) / len(rel),
        },
        "residuals": residuals,
    }


def table(report: dict, source: str, tile: int = TILE) -> dict:
    """The cost table (as data/cost_model.json holds it) fitted on `report`."""
    return {
        "source": source,
        "meta": report.get("meta", {}),
        "model": "ms = tile_ms*tiles + segment_ms*segments + call_ms*calls + row_ms*rows/1000",
        "terms": list(TERMS),
        "kernels": {k: kernel_table(report, k, source, tile) for k in PRICED},
        # measured apart (a new packing's first call against its later ones): kept as it is
        "plan_build_ms": json.loads(DATA.read_text()).get("plan_build_ms", {}),
    }


def provenance(replays: list[str]) -> dict:
    """The command that refits the table, and each replay file's machine, date and commit."""
    command = "python benchmarks/fit_layout_cost.py"
    if replays != [REPLAYS]:
        command += " --replays " + " ".join(replays)
    return {"command": command, "measured": [{"file": r, **MEASURED.get(r, {})} for r in replays]}


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
    fitted = table(pooled, ", ".join(args.replays))
    out = {"source": fitted.pop("source"), "provenance": provenance(args.replays), **fitted}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    summary = {k: {"constants": v["constants"], "fit": v["fit"]} for k, v in out["kernels"].items()}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
