"""Plot packed_varlen.py --real-ring --train-graph results: ms per call of every step, eager and
with training graphs, per (tokens, layout/kernel), a new packing per step (one PNG).

    python benchmarks/plot_packed_train_graph.py packed_kernels_16.json --out packed_kernels.png

One panel per row (tokens); per method a group of bars, one per step, eager and graphs side by
side; the per-document ideal (one GPU each document alone / N) is not in these JSONs.
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result")
    parser.add_argument("--out", default="packed_train_graph.png")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.load(open(args.result))
    rows = data["rows"]
    fig, axes = plt.subplots(1, len(rows), figsize=(7 * len(rows), 4.5), squeeze=False)
    for ax, row in zip(axes[0], rows, strict=True):
        x = 0.0
        ticks, names = [], []
        for name, m in row["methods"].items():
            steps = len(m["eager_ms_per_call"])
            for i in range(steps):
                ax.bar(x, m["eager_ms_per_call"][i], 0.4, color="tab:gray",
                       label="eager" if not names and i == 0 else None)  # fmt: skip
                ax.bar(x + 0.4, m["graph_ms_per_call"][i], 0.4, color="tab:blue",
                       label="training graphs" if not names and i == 0 else None)  # fmt: skip
                x += 1.0
            ticks.append(x - steps / 2 - 0.3)
            names.append(f"{name}\n(steps 0..{steps - 1})")
            x += 0.8
        ax.set_xticks(ticks, names)
        ax.set_yscale("log")
        ax.set_ylabel("ms per call (forward + backward)")
        ax.set_title(f"{row['tokens']} tokens, ring {row['ring']}: a new packing per step")
        ax.legend()
    meta = data["meta"]
    fig.suptitle(f"{meta.get('device')}, {meta.get('layers')} layers per packing")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
