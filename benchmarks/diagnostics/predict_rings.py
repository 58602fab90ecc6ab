"""Ring 8 and 16 predicted from what ring 4 measured (no 8-GPU machine was measured; no GPU).

    python benchmarks/diagnostics/predict_rings.py \
        --out docs/benchmarks/ring8-ring16-predictions-2026-11-26/predictions.json

For training (causal GQA 32/8 and non-causal 32 heads, d 128) and the forward (non-causal 24
heads) at 16k / 32k / 128k global tokens and at 4k tokens per GPU, two predictions per ring:

  planner    the planner's own (tokenring_xdit/planner/workload.py): the ring's kernel ceiling
             (planner/ceiling.py, fitted to the measured ceilings) plus the simulated per-step
             costs (transfers not hidden, merges) of the eager forward, x 2 with the backward
  anchored   the ring's kernel ceiling at N x the share of its ceiling TokenRing reached at
             ring 4 with the same tokens per GPU (--measured; interpolated in log tokens per GPU
             between the measured points, the nearest one outside them): the same blocks per step
             and the same per-step overheads, no credit for the first and last steps amortized
             over more steps

Ring 8: one node of 8 H200 on NVSwitch; ring 16: two such nodes over InfiniBand (the planner's
nominal link). The planner's ulysses prediction is given where the (K/V) heads allow it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from tokenring_xdit.planner.machine import make_machine
from tokenring_xdit.planner.workload import Workload, one_gpu_ms, ring_ceiling, split_prediction

HERE = Path(__file__).resolve()
DEFAULT_MEASURED = (
    HERE.parents[2]
    / "docs/benchmarks/ring8-ring16-predictions-2026-11-26"
    / "measured_ring2_ring4.json"
)
TOKENS = (16384, 32768, 131072)
PER_GPU = 4096
# (ring degree, nodes): 8 on one NVSwitch node; 16 in one NVSwitch domain (no such H200 box: it
# isolates what the kernels and per-step costs do) and on two 8-GPU nodes over InfiniBand
MACHINES = ((8, 1), (16, 1), (16, 2))


def _planner(m, w: Workload, heads: int, kv: int, tokens: int, u: int, r: int) -> tuple:
    p, c = split_prediction(m, w, "token_ring", heads, 128, tokens, u, r, kv_heads=kv)
    return one_gpu_ms(m, w, heads, 128, tokens) / (u * r) / p.ms, c


def _share_at(points: list[tuple[int, float]], per_gpu: int) -> tuple[float, str]:
    """Ring 4's share of its ceiling at `per_gpu` tokens per GPU (log-linear between points)."""
    points = sorted(points)
    if per_gpu <= points[0][0]:
        return points[0][1], f"ring 4 at {points[0][0]} per GPU (nearest)"
    if per_gpu >= points[-1][0]:
        return points[-1][1], f"ring 4 at {points[-1][0]} per GPU (nearest)"
    for (t0, s0), (t1, s1) in zip(points, points[1:], strict=False):
        if t0 <= per_gpu <= t1:
            x = math.log(per_gpu / t0) / math.log(t1 / t0)
            where = "ring 4 at " + (f"{t0} per GPU" if x == 0 else f"{t0}-{t1} per GPU")
            return s0 + x * (s1 - s0), where
    raise AssertionError("unreachable")


def predict(measured: list[dict]) -> list[dict]:
    out = []
    m4 = make_machine(4)
    for wl in dict.fromkeys(r["workload"] for r in measured):
        ring4 = [r for r in measured if r["workload"] == wl and r["ring"] == 4]
        first = ring4[0]
        w = Workload(causal=first["causal"], train=first["train"])
        heads, kv = first["heads"], first["kv_heads"]
        shares = []
        for r in ring4:
            c4 = ring_ceiling(m4, w, 4, r["tokens"], heads, kv, 128)[0]
            eff4, _ = _planner(m4, w, heads, kv, r["tokens"], 1, 4)
            shares.append((r["tokens"] // 4, r["token_ring"] / c4))
            out.append(dict(workload=wl, ring=4, tokens=r["tokens"], per_gpu=r["tokens"] // 4,
                            machine=m4.describe(), measured=r["token_ring"],
                            measured_ulysses=r["ulysses"], ceiling=c4, planner=eff4,
                            share_of_ceiling=r["token_ring"] / c4))  # fmt: skip
        for n, nodes in MACHINES:
            m = make_machine(n, nodes=nodes)
            for tokens in dict.fromkeys((*TOKENS, PER_GPU * n)):
                c = ring_ceiling(m, w, n, tokens, heads, kv, 128)[0]
                eff, _ = _planner(m, w, heads, kv, tokens, 1, n)
                share, where = _share_at(shares, tokens // n)
                row = dict(workload=wl, ring=n, tokens=tokens, per_gpu=tokens // n,
                           machine=m.describe(), ceiling=c, planner=eff,
                           anchored=c * share, share_from=where)  # fmt: skip
                if heads % n == 0 and kv % n == 0:
                    row["planner_ulysses"] = _planner(m, w, heads, kv, tokens, n, 1)[0]
                out.append(row)
    return out


def table(rows: list[dict]) -> str:
    lines = ["| workload | ring | tokens (per GPU) | measured | ceiling | planner | anchored |"
             " ulysses |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        uly = r.get("measured_ulysses", r.get("planner_ulysses"))
        note = " (planner)" if uly is not None and "measured" not in r else ""
        ring = f"{r['ring']}" + (" (2 nodes, IB)" if "2 node" in r["machine"] else "")
        lines.append(
            f"| {r['workload']} | {ring} | {r['tokens'] // 1024}k ({r['per_gpu']}) | "
            f"{_f(r.get('measured'))} | {_f(r['ceiling'])} | {_f(r['planner'])} | "
            f"{_f(r.get('anchored'))} | {_f(uly)}{note} |"
        )
    return "\n".join(lines)


def _f(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measured", default=str(DEFAULT_MEASURED))
    ap.add_argument("--out", default="predictions.json")
    args = ap.parse_args(argv)
    measured = json.loads(Path(args.measured).read_text())["rows"]
    rows = predict(measured)
    text = table(rows)
    print(text)
    meta = dict(
        command="python benchmarks/diagnostics/predict_rings.py " + " ".join(sys.argv[1:]),
        time=time.strftime("%Y-%m-%d %H:%M"),
        measured=Path(args.measured).name,
        caveat="predictions: no 8-GPU machine was measured; ceilings at ring 8/16 come from the "
        "split-block model fitted to the measured ceilings "
        "(docs/benchmarks/kernel-ceiling-h200-2026-11-26/)",
    )
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
