"""Plot packed_varlen.py --real-ring results: each packed (layout, kernel) entry's ms per
training call (forward + backward) beside the dense causal ring and the per-document ideal.

    python benchmarks/plot_packed_ring.py ring4_packed.json ring2_bc.json --out packed.png

One panel per (file, tokens) row: a bar per method (its slowest rank's median), the per-document
ideal (one GPU running each document alone through SDPA flash, / N) as a line, each bar labelled
with its share of that ideal (ideal / ms).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+")
    parser.add_argument("--out", default="packed_ring.png")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    for path in args.results:
        data = json.loads(Path(path).read_text())
        for row in data["rows"]:
            panels.append((Path(path).stem, data["meta"], row))
    cols = min(len(panels), 4)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.2 * rows), squeeze=False)
    for ax, (stem, meta, row) in zip(axes.flat, panels, strict=False):
        names = list(row["methods"])
        ms = [row["methods"][n]["ms"] for n in names]
        colors = [
            "tab:gray" if n == "dense_causal" else "tab:green" if n.startswith("contiguous")
            else "tab:blue"
            for n in names
        ]  # fmt: skip
        bars = ax.bar(range(len(names)), ms, color=colors)
        ideal = row["ideal_ring"]
        ax.axhline(ideal, color="black", linestyle="--", label=f"per-document ideal {ideal:.2f} ms")
        for bar, value in zip(bars, ms, strict=True):
            ax.annotate(f"{ideal / value:.2f}", (bar.get_x() + bar.get_width() / 2, value),
                        ha="center", va="bottom", fontsize=8)  # fmt: skip
        ax.set_xticks(range(len(names)), [n.replace("/", "\n") for n in names], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("ms per call (forward + backward)")
        ax.set_title(f"{stem}: {row['tokens']} tokens, {row['documents']} docs, ring "
                     f"{row['ring']} ({meta.get('order', 'packed')})", fontsize=9)  # fmt: skip
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    meta = panels[0][1] if panels else {}
    fig.suptitle(f"{meta.get('device')}, heads {meta.get('heads')}, {meta.get('dtype')}; "
                 "label: ideal / ms")  # fmt: skip
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
