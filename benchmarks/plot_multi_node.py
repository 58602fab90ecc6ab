"""Plot a multi-node stand-in folder: training and forward ms per call per method, one column
per launch (nodes x GPUs per node, link setting), the measured link in each column's title.

    python -m benchmarks plot_multi_node docs/benchmarks/across-nodes-standin-2xh200-2026-11-26
    python -m benchmarks plot_multi_node docs/benchmarks/across-nodes-standin-4xh200-2026-11-26

Reads train_<setting>.json (multi_node_train or train_sweep), sweep_<setting>.json (ring_sweep)
for every <setting> present, and for each the nccl_peers*.json launched with the same settings
(its meta "multi_node", stamped by benchmarks/multi_node.py; else nccl_peers_<setting>.json);
writes standin.png there. A setting with a forward sweep and no training run gets an empty
training panel, and the other way round.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

FORWARD = ("token_ring", "torch_ag", "yunchang_p2p", "ulysses")
LAUNCH_KEYS = ("nodes", "gpus_per_node", "nccl_socket_nthreads", "nccl_nsocks_perthread")


@dataclass
class Column:
    """One launch setting's panels: labels and {method: ms per label} for training and forward."""

    setting: str
    title: str
    train: tuple[list[str], dict[str, list[float]]] = field(default_factory=lambda: ([], {}))
    forward: tuple[list[str], dict[str, list[float]]] = field(default_factory=lambda: ([], {}))


def _launch(data: dict) -> dict:
    return data.get("meta", {}).get("multi_node", {})


def _probe(folder: Path, setting: str, launch: dict) -> dict | None:
    named = folder / f"nccl_peers_{setting}.json"
    if named.exists():
        return json.loads(named.read_text())
    for path in sorted(folder.glob("nccl_peers*.json")):
        data = json.loads(path.read_text())
        if launch and [_launch(data).get(k) for k in LAUNCH_KEYS] == [
            launch.get(k) for k in LAUNCH_KEYS
        ]:
            return data
    return None


def _title(setting: str, launch: dict, probe: dict | None) -> str:
    where = f"{launch['nodes']} x {launch['gpus_per_node']} GPU" if launch else setting
    if probe is None:
        return f"{setting}: {where}"
    big = max(probe["rows"], key=lambda r: r["MB"])
    if int(launch.get("gpus_per_node", 1)) > 1:
        # the probe's pairs stay inside a node; two_peers crosses once per rank
        net = big["two_peers_GBps_per_rank_out"] / 2
        return f"{setting}: {where}, network {net:.1f} GB/s per rank (all ranks crossing)"
    one = big["one_peer_one_way_GBps_per_rank_out"]
    both = big["one_peer_both_ways_GBps_per_rank_out"]
    return f"{setting}: {where}, link {one:.1f} GB/s one way, {both:.1f} each way both ways"


def _train_panel(data: dict) -> tuple[list[str], dict[str, list[float]]]:
    rows = [r for r in data["rows"] if r.get("ms")]
    groups = sorted({(r["shape"], r["seq"], bool(r.get("causal"))) for r in rows})
    methods = list(dict.fromkeys(r["impl"] for r in rows))
    ms = {(r["shape"], r["seq"], bool(r.get("causal")), r["impl"]): r["ms"] for r in rows}
    causal_in_name = all(s.endswith("c") == c for s, _, c in groups)
    labels = [
        f"{s}{'' if causal_in_name or not c else ' causal'} {n // 1024}k" for s, n, c in groups
    ]
    return labels, {m: [ms.get((*g, m), 0) for g in groups] for m in methods}


def _forward_panel(data: dict) -> tuple[list[str], dict[str, list[float]]]:
    rows = data["rows"]
    labels = [f"{r['model']} {r['tokens']}" for r in rows]
    return labels, {m: [r.get(f"{m}_ms") or 0 for r in rows] for m in FORWARD}


def columns(folder: Path) -> list[Column]:
    """Every launch setting of the folder with what was measured under it."""
    names = {p.stem.split("_", 1)[1] for p in folder.glob("train_*.json")}
    names |= {p.stem.split("_", 1)[1] for p in folder.glob("sweep_*.json")}
    out = []
    for setting in sorted(names):
        train_path, sweep_path = folder / f"train_{setting}.json", folder / f"sweep_{setting}.json"
        train = json.loads(train_path.read_text()) if train_path.exists() else None
        sweep = json.loads(sweep_path.read_text()) if sweep_path.exists() else None
        launch = _launch(train or {}) or _launch(sweep or {})
        col = Column(setting, _title(setting, launch, _probe(folder, setting, launch)))
        if train is not None:
            col.train = _train_panel(train)
        if sweep is not None:
            col.forward = _forward_panel(sweep)
        out.append(col)
    return out


def _gpu(folder: Path) -> str:
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        gpu = data.get("gpu") or data.get("meta", {}).get("gpu")
        if gpu:
            return gpu
    return "GPU"


def _bars(ax, groups: list[str], values: dict[str, list[float]], ylabel: str) -> None:
    ax.set(ylabel=ylabel)
    if not groups:
        ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
        return
    width = 0.8 / len(values)
    for i, (method, ys) in enumerate(values.items()):
        xs = [x + (i - (len(values) - 1) / 2) * width for x in range(len(groups))]
        ax.bar(xs, ys, width, label=method)
    ax.set_xticks(range(len(groups)), groups, rotation=30, ha="right", fontsize=8)
    ax.set(yscale="log")
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
    cols = columns(folder)
    if not cols:
        raise SystemExit(f"{folder}: no train_*.json or sweep_*.json")
    fig, axes = plt.subplots(2, len(cols), figsize=(7 * len(cols), 9), squeeze=False)
    for i, col in enumerate(cols):
        _bars(axes[0][i], *col.train, "training ms per call (fwd + bwd)")
        axes[0][i].set_title(col.title, fontsize=9)
        _bars(axes[1][i], *col.forward, "forward ms per call")
    fig.suptitle(f"multi-node stand-in: 'nodes' over NET/Socket on one host, {_gpu(folder)}")
    fig.tight_layout()
    out = args.out or str(folder / "standin.png")
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
