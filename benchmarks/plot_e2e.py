"""Plot e2e_pipeline.py results: seconds per image (20 steps) per setting, one panel per row.

  python benchmarks/plot_e2e.py docs/benchmarks/end-to-end-h200-2026-11-22/e2e_pixart_2xH200.json \
      docs/benchmarks/end-to-end-h200-2026-11-22/e2e_flux_2xH200.json \
      --out docs/benchmarks/end-to-end-h200-2026-11-22/e2e_2xH200.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from plot_sweep import split_label  # noqa: E402  (same folder: benchmarks/ is on sys.path)

# (JSON key, label); the "graph" settings replay the transformer as CUDA graphs
SETTINGS = [
    ("one_gpu_s", "1 GPU"),
    ("one_gpu_graph_s", "1 GPU + graph"),
    ("xdit_default_s", "xDiT ring"),
    ("xdit_default_graph_s", "xDiT ring + graph"),
    ("xdit_token_ring_s", "TokenRing"),
    ("xdit_token_ring_graph_s", "TokenRing + graph"),
]
COLORS = ["#888888", "#bbbbbb", "#2ca02c", "#98df8a", "#1f77b4", "#aec7e8"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("inputs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--machine", default="2 x H200 (NVLink)", help="for the title")
    args = ap.parse_args()
    rows = [row for path in args.inputs for row in json.loads(path.read_text())["rows"]]
    fig, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows), 4.2), squeeze=False)
    for ax, row in zip(axes[0], rows, strict=True):
        present = [
            (k, label, c) for (k, label), c in zip(SETTINGS, COLORS, strict=True) if k in row
        ]
        values = [row[k] for k, _, _ in present]
        bars = ax.bar(range(len(present)), values, color=[c for _, _, c in present])
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
        ax.set_xticks(
            range(len(present)),
            [label for _, label, _ in present],
            rotation=35,
            ha="right",
            fontsize=8,
        )
        ax.set_title(
            f"{row['model']} {row['size']} px, {row['steps']} steps, {split_label(row)}",
            fontsize=10,
        )
        ax.set_ylabel("seconds per image (denoising loop)")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"End to end, full-size random-weight pipelines, bf16, {args.machine}")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
