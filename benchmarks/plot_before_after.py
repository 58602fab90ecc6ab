"""Plot one code change's effect: new / old time per shape, from ring_sweep or train_sweep JSONs
of both versions made on one machine in one call (several runs of each: every ratio of a new run
to an old run is a point, so the spread shows the noise).

  python benchmarks/plot_before_after.py --old a.json b.json --new c.json d.json \
      --column token_ring_ms --out ratio.png [--title TEXT]

ring_sweep rows are keyed by (model, tokens) and read `--column` (e.g. token_ring_ms,
token_ring_eager_ms); train_sweep rows by (shape, seq, causal) for impl `--impl` (its `ms`).
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def times(path: Path, column: str, impl: str) -> dict[str, float]:
    rows = json.loads(path.read_text())["rows"]
    if rows and "impl" in rows[0]:  # train_sweep
        return {
            f"{r['shape']} {r['seq'] // 1024}k {'causal' if r['causal'] else 'full'}": r["ms"]
            for r in rows
            if r["impl"] == impl
        }
    return {f"{r['model']} {r['tokens']}": r[column] for r in rows if r.get(column)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--old", nargs="+", type=Path, required=True)
    ap.add_argument("--new", nargs="+", type=Path, required=True)
    ap.add_argument("--column", default="token_ring_ms", help="ring_sweep column")
    ap.add_argument("--impl", default="token_ring", help="train_sweep method")
    ap.add_argument("--title", default="")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    old = [times(p, args.column, args.impl) for p in args.old]
    new = [times(p, args.column, args.impl) for p in args.new]
    shapes = list(old[0])
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(shapes)), 4))
    for i, shape in enumerate(shapes):
        ratios = [n[shape] / o[shape] for o, n in itertools.product(old, new) if shape in n]
        ax.plot([i] * len(ratios), ratios, "o", color="tab:blue", alpha=0.6)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(shapes)), shapes, rotation=30, ha="right")
    ax.set_ylabel("new / old time")
    ax.set_title(args.title or f"{args.column if old else ''}: new / old")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
