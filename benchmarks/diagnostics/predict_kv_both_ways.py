"""Predicted forward + backward time per attention call: TokenRing, the K/V family (K/V halves
both ways round the ring) and ulysses, on the modelled NVSwitch H200 fabric (no GPU needed).

    python benchmarks/diagnostics/predict_kv_both_ways.py \
        --out docs/benchmarks/kv-both-ways-predicted-h200-2026-11-29/predicted.json

Rings 2, 4 and 8 (ulysses of the same degree beside each), 4k-32k tokens per GPU, GQA 32/8 and
64/8 and MHA 32 heads of 128, bf16, causal (zigzag) and not. The ring families come from
`tokenring_xdit/planner/kv_both_ways.py` (each family's own table simulated on every rank; a
graphed call's GPU time), ulysses from the planner's training model (`workload.split_prediction`).
The meta holds the model's check against what was measured: graphed TokenRing and ulysses at
ring 4 on 4 x H200 (docs/benchmarks/training-ring4-h200-2026-11/train_graph_ring4.json) and the kernels alone
of TokenRing's blocks (docs/benchmarks/kernel-ceiling-h200-2026-11-26/ceiling_1xH200.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

from tokenring_xdit.planner.kv_both_ways import TrainShape, _token_ring_rows, pass_bytes, train_ms
from tokenring_xdit.planner.machine import make_machine
from tokenring_xdit.planner.workload import Workload, split_prediction

REPO = Path(__file__).resolve().parents[2]
MEASURED = REPO / "docs/benchmarks/training-ring4-h200-2026-11/train_graph_ring4.json"
CEILING = REPO / "docs/benchmarks/kernel-ceiling-h200-2026-11-26/ceiling_1xH200.json"
SHAPES = {"GQA 32/8": (32, 8), "GQA 64/8": (64, 8), "MHA 32": (32, 32)}
HEAD_DIM = 128


def _ulysses_ms(m, causal: bool, heads: int, kv_heads: int, tokens: int, u: int) -> float:
    pred, _ = split_prediction(m, Workload(causal, True), "ulysses", heads, HEAD_DIM, tokens,
                               u, 1, kv_heads=kv_heads)  # fmt: skip
    return pred.ms


def _row(ring: int, per_gpu: int, shape: str, causal: bool) -> dict:
    heads, kv_heads = SHAPES[shape]
    m = make_machine(ring)
    s = TrainShape(heads, kv_heads, HEAD_DIM, per_gpu, causal)
    ranks = list(range(ring))
    tr, kv = (train_ms(m, f, s, ranks) for f in ("token_ring", "kv_both_ways"))
    uly = _ulysses_ms(m, causal, heads, kv_heads, per_gpu * ring, ring)
    mb = {f"{f}_{p}_mb_per_step": round(pass_bytes(f, s, ring, p == "bwd") / 1e6, 2)
          for f in ("token_ring", "kv_both_ways") for p in ("fwd", "bwd")}  # fmt: skip
    return dict(
        ring=ring, tokens_per_gpu=per_gpu, tokens=per_gpu * ring, shape=shape, heads=heads,
        kv_heads=kv_heads, causal=causal, token_ring_ms=round(tr["ms"], 3),
        kv_both_ways_ms=round(kv["ms"], 3), ulysses_ms=round(uly, 3),
        kv_over_token_ring=round(kv["ms"] / tr["ms"], 3), kv_over_ulysses=round(kv["ms"] / uly, 3),
        token_ring_parts={k: round(v, 3) for k, v in tr.items()},
        kv_both_ways_parts={k: round(v, 3) for k, v in kv.items()}, **mb,
    )  # fmt: skip


def _check_measured() -> list[dict]:
    """The model against graphed TokenRing and ulysses measured at ring 4 on 4 x H200."""
    rows = json.loads(MEASURED.read_text())["rows"]
    out = []
    m = make_machine(4)
    for r in rows:
        if r["impl"] not in ("token_ring_graph", "ulysses"):
            continue
        s = TrainShape(r["heads"], r["kv_heads"], r["head_dim"], r["seq"] // 4, r["causal"])
        if r["impl"] == "ulysses":
            pred = _ulysses_ms(m, r["causal"], r["heads"], r["kv_heads"], r["seq"], 4)
        else:
            pred = train_ms(m, "token_ring", s, [0, 1, 2, 3])["ms"]
        out.append(dict(shape=r["shape"], tokens=r["seq"], causal=r["causal"], impl=r["impl"],
                        measured_ms=round(r["ms"], 3), predicted_ms=round(pred, 3),
                        error=round(pred / r["ms"] - 1, 3)))  # fmt: skip
    return out


def _check_kernels() -> list[dict]:
    """TokenRing's blocks alone (forward + backward, busiest rank) against the ceiling run."""
    out = []
    for r in json.loads(CEILING.read_text())["rows"]:
        if r["pass"] != "fwd+bwd" or r["tokens"] > 32768:
            continue
        n = r["ring"]
        s = TrainShape(r["heads"], r["kv_heads"], r["head_dim"], r["tokens_per_rank"],
                       r["mask"] == "causal")  # fmt: skip
        m = make_machine(n)
        rows = _token_ring_rows(m, s, n, False) + _token_ring_rows(m, s, n, True)
        pred = max(sum(row[i][0] for row in rows) for i in range(n))
        out.append(dict(ring=n, tokens=r["tokens"], mask=r["mask"], kv_heads=r["kv_heads"],
                        measured_ms=round(r["busiest_ms"], 3), predicted_ms=round(pred, 3),
                        error=round(pred / r["busiest_ms"] - 1, 3)))  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = [_row(ring, t, shape, causal) for ring in (2, 4, 8) for t in (4096, 8192, 16384, 32768)
            for shape in SHAPES for causal in (True, False)]  # fmt: skip
    measured, kernels = _check_measured(), _check_kernels()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    meta = dict(
        command=f"python benchmarks/diagnostics/predict_kv_both_ways.py --out {args.out}",
        commit=commit, time=time.strftime("%Y-%m-%d %H:%M"),
        machine="modelled: 1 node x ring-degree NVIDIA H200, nvswitch fabric (planner/data)",
        what="predicted GPU ms of one forward + backward attention call per rank (a graphed "
             "call; host time not included), head dim 128, bf16, batch 1",
        check_graphed_ring4=measured,
        check_graphed_ring4_median_abs_error=statistics.median(abs(x["error"]) for x in measured),
        check_kernels_alone=kernels,
        check_kernels_alone_median_abs_error=statistics.median(abs(x["error"]) for x in kernels),
    )  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    for r in rows:
        mask = "causal" if r["causal"] else "full  "
        times = f"TokenRing {r['token_ring_ms']:8.2f}  K/V both ways {r['kv_both_ways_ms']:8.2f}"
        print(
            f"ring {r['ring']} {r['tokens_per_gpu']:>5}/GPU {r['shape']:>8} {mask}  {times}  "
            f"ulysses {r['ulysses_ms']:8.2f}"
        )


if __name__ == "__main__":
    main()
