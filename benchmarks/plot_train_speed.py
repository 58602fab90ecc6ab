"""Plot train_ring1.py and replay_rank.py results side by side (one PNG).

    python benchmarks/plot_train_speed.py train_ring1.json replay_rank.json --out train_speed.png

Left: ring degree 1 forward + backward, TokenRing and SDPA flash relative to SDPA cuDNN (1.0 =
as fast) per shape and dtype. Right: one rank's replayed work at ring N over whole-sequence
cuDNN time / N, per tokens per rank (1.0 = the split costs nothing; the 1.10 line is the goal).
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ring1")
    parser.add_argument("replay")
    parser.add_argument("--out", default="train_speed.png")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ring1, replay = (json.load(open(p)) for p in (args.ring1, args.replay))
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5))
    rows = ring1["rows"]
    labels = [f"{r['heads']}x{r['seq'] // 1024}k {'c' if r['causal'] else 'f'} {r['dtype'][:4]}"
              for r in rows]  # fmt: skip
    xs = range(len(rows))
    left.bar([x - 0.2 for x in xs], [r["speed_vs_cudnn"] for r in rows], 0.4, label="TokenRing")
    flash = [
        r["sdpa_cudnn"]["ms"] / r["sdpa_flash"]["ms"] if "sdpa_flash" in r else 0 for r in rows
    ]
    left.bar([x + 0.2 for x in xs], flash, 0.4, label="SDPA flash")
    left.axhline(1.0, color="k", lw=0.8)
    left.axhline(0.95, color="r", ls="--", lw=0.8, label="0.95 goal")
    left.set_xticks(list(xs), labels, rotation=60, ha="right", fontsize=8)
    left.set_ylabel("speed vs SDPA cuDNN (fwd+bwd)")
    left.set_title(f"ring degree 1, {ring1['gpu']}")
    left.legend(fontsize=8)
    for causal, marker in ((True, "o"), (False, "s")):
        for n in sorted({r["ring"] for r in replay["rows"]}):
            pts = sorted(
                (r["tokens_per_rank"], r["ratio"])
                for r in replay["rows"]
                if r["ring"] == n and r["causal"] == causal and "ratio" in r
            )
            if pts:
                right.plot(*zip(*pts, strict=True), marker=marker,
                           label=f"ring {n} {'causal' if causal else 'full'}")  # fmt: skip
    right.axhline(1.10, color="r", ls="--", lw=0.8, label="1.10 goal")
    right.axhline(1.0, color="k", lw=0.8)
    right.set_xscale("log", base=2)
    right.set_xlabel("tokens per rank")
    right.set_ylabel("replayed rank time / (whole-sequence cuDNN / N)")
    right.set_title("one rank's work at ring N, replayed on one GPU")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
