"""Predicted forward + backward time per attention call with a sliding window: TokenRing running
the window's plan (zigzag and contiguous shards) and the K/V family running its own (zigzag
shards) vs the full causal call, beside ulysses of the same degree, on the modelled H200 fabric
(no GPU needed).

    python benchmarks/diagnostics/predict_windows.py \
        --out docs/benchmarks/windows-predicted-h200-2026-11-29/predicted.json

Rings 4 and 8 on one node (NVSwitch) and ring 8 over 2 nodes of 4 (InfiniBand between them),
128k-1M tokens, causal windows of 128, 1024 and 4096 tokens, GQA 32/8 and 64/8, head dim 128,
bf16. TokenRing comes from `tokenring_xdit/planner/window.py` (the plan's blocks and transfers,
simulated on every rank), the K/V family from `planner/kv_window.py` (the same, from its plan),
ulysses from the planner's training model with its kernel narrowed to the band (window.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

from tokenring_xdit.planner.kv_both_ways import TrainShape
from tokenring_xdit.planner.kv_window import kv_window_train_ms
from tokenring_xdit.planner.machine import make_machine
from tokenring_xdit.planner.window import SPLITS, TILE, ulysses_window_ms, window_train_ms

REPO = Path(__file__).resolve().parents[2]
SHAPES = {"GQA 32/8": (32, 8), "GQA 64/8": (64, 8)}
MACHINES = {"ring 4, 1 node": (4, 1), "ring 8, 1 node": (8, 1), "ring 8, 2 nodes": (8, 2)}
TOKENS = (131072, 262144, 524288, 1048576)
WINDOWS = (128, 1024, 4096, None)
HEAD_DIM = 128


def _rounded(got: dict) -> dict:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in got.items()}


def _ring(m, s: TrainShape, n: int, window: int | None) -> dict:
    """Both splits of one windowed call, and the faster."""
    out = {split: _rounded(window_train_ms(m, s, list(range(n)), window, split))
           for split in SPLITS}  # fmt: skip
    out["pick"] = min(SPLITS, key=lambda split: out[split]["ms"])
    return out


def _row(where: str, tokens: int, shape: str, window: int | None) -> dict:
    n, nodes = MACHINES[where]
    heads, kv_heads = SHAPES[shape]
    m = make_machine(n, nodes=nodes)
    s = TrainShape(heads, kv_heads, HEAD_DIM, tokens // n, causal=True)
    ring = _ring(m, s, n, window)
    kv = _rounded(kv_window_train_ms(m, s, list(range(n)), window))
    uly = ulysses_window_ms(m, heads, kv_heads, HEAD_DIM, tokens, n, window)
    best = ring[ring["pick"]]["ms"]
    return dict(
        machine=where, ring=n, nodes=nodes, tokens=tokens, tokens_per_gpu=tokens // n,
        shape=shape, heads=heads, kv_heads=kv_heads, window=window, token_ring=ring,
        token_ring_ms=best, kv_both_ways=kv, kv_ms=kv["ms"], ulysses_ms=round(uly["ms"], 3),
        ulysses_parts={k: round(v, 3) for k, v in uly.items()},
        ring_over_ulysses=round(best / uly["ms"], 3),
        kv_over_ulysses=round(kv["ms"] / uly["ms"], 3),
        kv_over_zigzag=round(kv["ms"] / ring["zigzag"]["ms"], 3),
    )  # fmt: skip


def _with_full(rows: list[dict]) -> None:
    """Each windowed row's time over the full causal call of the same machine, size, shape."""
    full = {(r["machine"], r["tokens"], r["shape"]): r for r in rows if r["window"] is None}
    for r in rows:
        f = full[(r["machine"], r["tokens"], r["shape"])]
        r["ring_over_full_causal"] = round(r["token_ring_ms"] / f["token_ring_ms"], 4)
        r["kv_over_full_causal"] = round(r["kv_ms"] / f["kv_ms"], 4)
        r["ulysses_over_full_causal"] = round(r["ulysses_ms"] / f["ulysses_ms"], 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = [_row(where, t, shape, w) for where in MACHINES for t in TOKENS for shape in SHAPES
            for w in WINDOWS]  # fmt: skip
    _with_full(rows)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    meta = dict(
        command=f"python benchmarks/diagnostics/predict_windows.py --out {args.out}",
        commit=commit, time=time.strftime("%Y-%m-%d %H:%M"),
        machine="no GPU: the planner's model of NVIDIA H200 (planner/data): 1 node x 4 or 8 on "
                "its nvswitch fabric, 2 nodes x 4 with ib between them",
        what="predicted GPU ms of one causal forward + backward attention call per rank (a "
             "graphed call; host time not included), head dim 128, bf16, batch 1; window = "
             "a causal window of W tokens, window_size=(W - 1, 0); null = none",
        kernels=f"blocks the window left alone: cuDNN (the calibration table); banded blocks: "
                f"torch's flash op, each segment the table's dense block of its rows x columns "
                f"times the share of its {TILE} x {TILE} tiles holding a visible pair, at least "
                f"one tile's block",
        transfers="what the window's plan moves: Q only while a later holder needs it, "
                  "returns only of blocks that ran, contiguous shards cut to the rows W reaches",
        kv_both_ways="the K/V family (travel='kv') on zigzag shards, from its plan "
                     "(ring/packed/kv_plan.py): its blocks priced as TokenRing's on a half's "
                     "heads, its kept K/V halves and dK/dV sums per step and direction",
    )  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    for r in rows:
        w = f"W {r['window']:>5}" if r["window"] else "causal "
        zz, ct = (r["token_ring"][s]["ms"] for s in SPLITS)
        print(f"{r['machine']:>15} {r['tokens'] // 1024:>5}k {r['shape']} {w}  zigzag "
              f"{zz:9.2f}  contiguous {ct:9.2f}  kv {r['kv_ms']:9.2f}  "
              f"ulysses {r['ulysses_ms']:9.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
