"""Plot one code change's effect: new / old time per shape, from ring_sweep or train_sweep JSONs
of both versions made on one machine in one call (several runs of each: every ratio of a new run
to an old run is a point, so the spread shows the noise).

  python benchmarks/plot_before_after.py --old a.json b.json --new c.json d.json \
      --column token_ring_ms --out ratio.png [--title TEXT] [--control torch_ag_ms ...]

ring_sweep rows are keyed by (model, tokens) and read `--column` (e.g. token_ring_ms,
token_ring_eager_ms); train_sweep rows by (shape, seq, causal) for impl `--impl` (its `ms`);
packed_varlen --real-ring rows by (tokens, documents, ring) for method `--impl` or `--column`
(e.g. auto, dense_causal: its `ms`).
`--control`: columns (ring_sweep) or impls (train_sweep) whose code did not change, plotted
beside it: how far the same runs moved without the change.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path


def times(path: Path, column: str, impl: str) -> dict[str, float]:
    rows = json.loads(path.read_text())["rows"]
    if rows and isinstance(rows[0].get("methods"), dict):  # packed_varlen --real-ring
        return {
            f"{r['tokens'] // 1024}k {r['documents']} docs ring {r['ring']}": r["methods"][m]["ms"]
            for r in rows
            for m in [impl if impl in r["methods"] else column]
            if m in r["methods"]
        }
    if rows and "impl" in rows[0]:  # train_sweep
        return {
            f"{r['shape']} {r['seq'] // 1024}k {'causal' if r['causal'] else 'full'}": r["ms"]
            for r in rows
            if r["impl"] == impl
        }
    return {f"{r['model']} {r['tokens']}": r[column] for r in rows if r.get(column)}


def ratio_points(
    old: list[Path], new: list[Path], column: str, impl: str
) -> dict[str, list[float]]:
    """shape -> new / old time for every (old run, new run) pair that has the shape."""
    olds = [times(p, column, impl) for p in old]
    news = [times(p, column, impl) for p in new]
    return {
        shape: [n[shape] / o[shape] for o, n in itertools.product(olds, news) if shape in n]
        for shape in olds[0]
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--old", nargs="+", type=Path, required=True)
    ap.add_argument("--new", nargs="+", type=Path, required=True)
    ap.add_argument("--column", default="token_ring_ms", help="ring_sweep column")
    ap.add_argument("--impl", default="token_ring", help="train_sweep method")
    ap.add_argument("--control", nargs="*", default=[], help="unchanged columns / impls")
    ap.add_argument("--title", default="")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = json.loads(args.old[0].read_text())["rows"]
    main_name = args.impl if rows and "impl" in rows[0] else args.column
    colors = itertools.cycle(("tab:gray", "tab:orange", "tab:green", "tab:purple"))
    series = [(main_name, args.column, args.impl, "tab:blue")]
    series += [(c, c, c, next(colors)) for c in args.control]  # a column or an impl
    shapes = list(ratio_points(args.old, args.new, args.column, args.impl))
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(shapes)), 4))
    for k, (name, column, impl, color) in enumerate(series):
        pts = ratio_points(args.old, args.new, column, impl)
        for i, shape in enumerate(shapes):
            ys = pts.get(shape, [])
            ax.plot([i + 0.12 * k] * len(ys), ys, "o", color=color, alpha=0.6,
                    label=name if i == 0 else None)  # fmt: skip
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(shapes)), shapes, rotation=30, ha="right")
    ax.set_ylabel("new / old time")
    ax.set_title(args.title or f"{args.column}: new / old")
    if args.control:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
