"""Plot ring_sweep.py results: time per call and efficiency vs tokens, one panel per model.

  python benchmarks/plot_sweep.py \
      docs/benchmarks/inference-ring-call-h200-2026-11-22/sweep_2xH200_nvlink.json [more ...]
Writes <json>.png next to each input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

METHODS = [
    "token_ring",
    "token_ring_whole_own",
    "token_ring_eager",
    "torch_ag",
    "torch_a2a",
    "yunchang_p2p",
    "ulysses",
]


def plot(path: Path) -> Path:
    data = json.loads(path.read_text())
    rows, meta = data["rows"], data["meta"]
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(2, len(models), figsize=(6 * len(models), 8), squeeze=False)
    for col, model in enumerate(models):
        sel = sorted((r for r in rows if r["model"] == model), key=lambda r: r["tokens"])
        tokens = [r["tokens"] for r in sel]
        ax_t, ax_e = axes[0][col], axes[1][col]
        ax_t.plot(tokens, [r["ideal_ms"] for r in sel], "k--", label="ideal (1 GPU / N)")
        for m in METHODS:
            pts = [(r["tokens"], r.get(f"{m}_ms")) for r in sel if r.get(f"{m}_ms")]
            if pts:
                ax_t.plot(*zip(*pts, strict=True), marker="o", label=m)
                eff = [(r["tokens"], r[f"{m}_efficiency"]) for r in sel if r.get(f"{m}_ms")]
                ax_e.plot(*zip(*eff, strict=True), marker="o", label=m)
        head = f"{model} {sel[0]['heads']}x{sel[0]['head_size']}, {split_label(sel[0])}"
        ax_t.set(xscale="log", yscale="log", xlabel="tokens", ylabel="ms per call", title=head)
        ax_e.set(xscale="log", xlabel="tokens", ylabel="efficiency (ideal / time)", ylim=(0, 1.05))
        ax_e.axhline(0.9, color="grey", lw=0.5)
        for ax in (ax_t, ax_e):
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    p2p = "NCCL_P2P_DISABLE=1" if meta.get("nccl_p2p_disable") == "1" else "NVLink P2P"
    ranks = sel[0].get("ranks", sel[0]["ring"])
    fig.suptitle(f"{meta['gpu']} x{ranks}, {p2p}, torch {meta['torch']}")
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def split_label(row: dict) -> str:
    """'ring R' or 'ulysses U x ring R' of a sweep or e2e row (older rows lack some keys)."""
    u = row.get("ulysses", 1)
    ring = row.get("ring") or row["ranks"] // u
    return f"ulysses {u} x ring {ring}" if u > 1 else f"ring {ring}"


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(plot(Path(arg)))
