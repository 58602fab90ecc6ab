"""Plot a multi-node stand-in folder: training and forward ms per call per method, one panel per
link setting, the measured link bandwidth in each panel's title.

    python -m benchmarks plot_multi_node docs/benchmarks/multi_node_standin

Reads train_<setting>.json (multi_node_train), sweep_<setting>.json (ring_sweep) and
nccl_peers_<setting>.json (the link probe) for every <setting> present; writes standin.png there.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

FORWARD = ("token_ring", "torch_ag", "yunchang_p2p", "ulysses")


def _link(folder: Path, setting: str) -> str:
    path = folder / f"nccl_peers_{setting}.json"
    if not path.exists():
        return ""
    big = max(json.loads(path.read_text())["rows"], key=lambda r: r["MB"])
    one = big["one_peer_one_way_GBps_per_rank_out"]
    both = big["one_peer_both_ways_GBps_per_rank_out"]
    return f"link {one:.1f} GB/s one way, {both:.1f} each way both ways"


def _bars(ax, groups: list[str], values: dict[str, list[float]], ylabel: str) -> None:
    width = 0.8 / len(values)
    for i, (method, ys) in enumerate(values.items()):
        xs = [x + (i - (len(values) - 1) / 2) * width for x in range(len(groups))]
        ax.bar(xs, ys, width, label=method)
    ax.set_xticks(range(len(groups)), groups, rotation=30, ha="right", fontsize=8)
    ax.set(ylabel=ylabel, yscale="log")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--out", help="default: <folder>/standin.png")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(args.folder)
    settings = sorted(p.stem[len("train_") :] for p in folder.glob("train_*.json"))
    fig, axes = plt.subplots(2, len(settings), figsize=(7 * len(settings), 9), squeeze=False)
    for col, setting in enumerate(settings):
        train = json.loads((folder / f"train_{setting}.json").read_text())
        rows = [r for r in train["rows"] if r.get("ms")]
        groups = sorted({(r["shape"], r["seq"]) for r in rows}, key=lambda g: (g[0], g[1]))
        methods = list(dict.fromkeys(r["impl"] for r in rows))
        ms = {(r["shape"], r["seq"], r["impl"]): r["ms"] for r in rows}
        values = {m: [ms.get((*g, m), 0) for g in groups] for m in methods}
        labels = [f"{s} {n // 1024}k" for s, n in groups]
        _bars(axes[0][col], labels, values, "training ms per call (fwd + bwd)")
        axes[0][col].set_title(f"{setting}: {_link(folder, setting)}", fontsize=9)
        sweep_path = folder / f"sweep_{setting}.json"
        if sweep_path.exists():
            sweep = json.loads(sweep_path.read_text())["rows"]
            labels = [f"{r['model']} {r['tokens']}" for r in sweep]
            values = {m: [r.get(f"{m}_ms") or 0 for r in sweep] for m in FORWARD}
            _bars(axes[1][col], labels, values, "forward ms per call")
    fig.suptitle(f"two one-GPU 'nodes' over NET/Socket, ring 2: {train['meta']['gpu']}")
    fig.tight_layout()
    out = args.out or str(folder / "standin.png")
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
