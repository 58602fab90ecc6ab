"""Plot `python -m benchmarks ceiling --windows ...` results: the kernel ceiling vs tokens, one
panel per window W (rows: fwd, fwd+bwd), a line per split and ring degree; and, beside it, each
window kernel's ms over the busiest rank's banded segments (which kernel suits band blocks).

  python benchmarks/plot_window_ceiling.py docs/benchmarks/<dir>/window_ceiling.json [more ...]
Writes <json>.png next to each input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MARKERS = {"zigzag": "o", "contiguous": "s"}


def plot(path: Path) -> Path:
    data = json.loads(path.read_text())
    rows, meta = [r for r in data["rows"] if r.get("ceiling")], data["meta"]
    windows = sorted({r["window"] for r in rows})
    passes = [p for p in ("fwd", "fwd+bwd") if any(r["pass"] == p for r in rows)]
    fig, axes = plt.subplots(len(passes), len(windows), figsize=(5 * len(windows), 4 * len(passes)),
                             squeeze=False)  # fmt: skip
    for (i, pass_), (j, w) in ((a, b) for a in enumerate(passes) for b in enumerate(windows)):
        ax = axes[i][j]
        sel = [r for r in rows if r["window"] == w and r["pass"] == pass_]
        for line in sorted({_line_of(r) for r in sel}):
            split, ring, kv = line
            pts = sorted((r["tokens"], r["ceiling"]) for r in sel if _line_of(r) == line)
            ax.plot(*zip(*pts, strict=True), marker=MARKERS.get(split, "x"),
                    label=f"{split} ring {ring}, kv {kv}")  # fmt: skip
        whole = {r["whole_kernel"] for r in sel}
        ax.set(xscale="log", xlabel="tokens", ylabel="ceiling (whole / N / busiest rank)",
               title=f"W = {w}, {pass_} (whole: {', '.join(sorted(whole))})")  # fmt: skip
        _token_ticks(ax, {r["tokens"] for r in sel})
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"kernel ceiling with a causal window, {meta['device']}, torch {meta['torch']}")
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _token_ticks(ax, tokens) -> None:
    """The measured lengths as the only x ticks (32k, 64k, ...): log-scale minor labels overlap."""
    ax.set_xticks(sorted(tokens), [f"{t // 1024}k" for t in sorted(tokens)])
    ax.minorticks_off()


def _line_of(row: dict) -> tuple:
    return row["split"], row["ring"], row["kv_heads"]


def plot_bands(path: Path) -> Path | None:
    """ms per band kernel over each row's busiest-rank banded segments vs tokens (one panel
    per W and pass); None when the file has no band timings."""
    data = json.loads(path.read_text())
    rows = [r for r in data["rows"] if r.get("band_kernels_ms")]
    if not rows:
        return None
    keys = sorted({(r["window"], r["pass"]) for r in rows})
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4), squeeze=False)
    for ax, (w, pass_) in zip(axes[0], keys, strict=True):
        sel = [r for r in rows if (r["window"], r["pass"]) == (w, pass_)]
        for kernel in sorted({k for r in sel for k in r["band_kernels_ms"]}):
            for split, ring in sorted({(r["split"], r["ring"]) for r in sel}):
                pts = sorted((r["tokens"], r["band_kernels_ms"][kernel]) for r in sel
                             if (r["split"], r["ring"]) == (split, ring)
                             and isinstance(r["band_kernels_ms"].get(kernel), float))  # fmt: skip
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker=MARKERS.get(split, "x"),
                            label=f"{kernel}: {split} ring {ring}")  # fmt: skip
        ax.set(xscale="log", yscale="log", xlabel="tokens", ylabel="ms (busiest rank's bands)",
               title=f"band kernels, W = {w}, {pass_}")  # fmt: skip
        _token_ticks(ax, {r["tokens"] for r in sel})
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    out = path.with_name(path.stem + "_bands.png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(plot(Path(arg)))
        bands = plot_bands(Path(arg))
        if bands is not None:
            print(bands)
