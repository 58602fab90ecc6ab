"""Plot train_sweep.py results: forward + backward ms per call, one bar per method and shape.

    python benchmarks/plot_train_sweep.py train4.json [--ring1 train1.json] --out train4.png

(multi_node_train.py's JSON too: its run facts are under "meta".)

With --ring1 (a `--nproc_per_node 1` run on the same card) a second panel shows each method's
efficiency t_1 / (N t_N), t_1 = the fastest ring-1 time of the shape.
"""

from __future__ import annotations

import argparse
import json


def _by_shape(rows: list[dict]) -> dict[tuple, dict[str, float]]:
    shapes: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if r.get("ms"):
            key = (r["heads"], r["seq"], r["causal"])
            shapes.setdefault(key, {})[r["impl"]] = r["ms"]
    return shapes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep")
    ap.add_argument("--ring1", help="the same shapes at --nproc_per_node 1 (efficiency panel)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loaded = json.load(open(args.sweep))
    data = {**loaded.get("meta", {}), **loaded}  # multi_node_train.py keeps the run in "meta"
    shapes = _by_shape(data["rows"])
    keys = sorted(shapes, key=lambda k: (k[0], not k[2], k[1]))
    methods = sorted({m for ms in shapes.values() for m in ms}, key=lambda m: m != "token_ring")
    ring1 = _by_shape(json.load(open(args.ring1))["rows"]) if args.ring1 else None
    panels = 2 if ring1 else 1
    fig, axes = plt.subplots(panels, 1, figsize=(14, 4.5 * panels), squeeze=False)
    width = 0.8 / len(methods)
    labels = [f"{h}h {s // 1024}k {'causal' if c else 'full'}" for h, s, c in keys]
    n = data["world"]
    for i, m in enumerate(methods):
        xs = [x + (i - len(methods) / 2) * width for x in range(len(keys))]
        axes[0][0].bar(xs, [shapes[k].get(m, 0) for k in keys], width, label=m)
        if ring1:
            eff = [min(ring1[k].values()) / (n * shapes[k][m]) if m in shapes[k] else 0
                   for k in keys]  # fmt: skip
            axes[1][0].bar(xs, eff, width, label=m)
    axes[0][0].set(ylabel="ms per call (fwd + bwd)", yscale="log")
    if ring1:
        axes[1][0].set(ylabel="efficiency t1 / (N tN)", ylim=(0, 1.05))
        axes[1][0].axhline(0.95, color="r", ls="--", lw=0.8)
    for ax in axes[:, 0]:
        ax.set_xticks(range(len(keys)), labels, rotation=30, ha="right", fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8, ncol=3)
    split = f"ulysses {data.get('ulysses', 1)} x ring {data.get('ring', n)}"
    fig.suptitle(args.title or f"{data['gpu']} x{n}, {split}, torch {data['torch']}")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
