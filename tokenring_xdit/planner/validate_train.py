"""`plan --validate`, training part: predict the committed train sweeps (benchmarks/train_sweep.py
JSON: rows of shape, heads, head_dim, seq, causal, world, impl, ms) with the training model
(workload.py: TokenRing and ulysses, forward + backward, causal or not) and score them.

A folder is scored when it holds `train_ring1.json` (the one-GPU run, the efficiency reference)
beside runs on more GPUs (`train_*.json` with world > 1; USP splits carry ulysses / ring). Error
is |predicted / measured - 1| per (row, method), as for the forward sweeps; nothing is fitted on
these rows (the ceilings come from docs/benchmarks/kernel-ceiling-h200-2026-11-26/, the kernels
from the calibration table, the forward overheads from the simulation)."""

from __future__ import annotations

import glob
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from .machine import make_machine
from .validate import Check
from .workload import Workload, split_prediction

__all__ = ["TrainCheck", "validate_training", "training_lines"]

METHODS = {"token_ring": "token_ring", "ulysses": "ulysses"}


@dataclass
class TrainCheck(Check):
    """A validate.Check (model: the shape's name, tokens: the sequence) of a training row."""

    causal: bool = False


def _folders(bench_dir: Path) -> list[Path]:
    found = glob.glob(str(bench_dir / "train_ring1.json")) + glob.glob(
        str(bench_dir / "*" / "train_ring1.json")
    )
    return sorted(Path(p).parent for p in found)


def validate_training(bench_dir: str | Path) -> list[TrainCheck]:
    checks = []
    for folder in _folders(Path(bench_dir)):
        ref_rows = json.loads((folder / "train_ring1.json").read_text())["rows"]
        one = {(r["shape"], r["seq"], r["causal"]): r["ms"] for r in ref_rows if "ms" in r}
        for path in sorted(folder.glob("train_*.json")):
            data = json.loads(path.read_text())
            world = int(data.get("world", 1))
            if world <= 1 or "rows" not in data:
                continue
            m = make_machine(world, gpu=data.get("gpu", "NVIDIA H200"))
            for row in data["rows"]:
                if row.get("impl") not in METHODS or "ms" not in row:
                    continue
                if (row["shape"], row["seq"], row["causal"]) not in one:
                    continue
                u = world if row["impl"] == "ulysses" else int(row.get("ulysses", 1))
                r = 1 if row["impl"] == "ulysses" else world // u
                w = Workload(causal=bool(row["causal"]), train=True)
                p, _ = split_prediction(m, w, "token_ring", row["heads"], row["head_dim"],
                                        row["seq"], u, r, kv_heads=row.get("kv_heads"))  # fmt: skip
                label = f"{folder.name}/{path.name}"
                checks.append(TrainCheck(label, row["shape"], row["seq"], u, r, row["impl"],
                                         row["ms"], p.ms, causal=bool(row["causal"])))  # fmt: skip
    return checks


def training_lines(bench_dir: str | Path, verbose: bool = False) -> list[str]:
    """Report lines (empty when the folder holds no training runs with a one-GPU reference)."""
    checks = validate_training(bench_dir)
    if not checks:
        return []
    lines = []
    if verbose:
        for c in checks:
            mask = "causal" if c.causal else "full"
            lines.append(
                f"{c.file:40} {c.model:15} {c.tokens:6} {mask:6} {c.ulysses}x{c.ring} {c.method:10}"
                f" {c.measured_ms:8.3f} {c.predicted_ms:8.3f} {c.error:+5.0%}"
            )
    for method in sorted({c.method for c in checks}):
        errs = [abs(c.error) for c in checks if c.method == method]
        lines.append(f"  train {method:11} median abs error {statistics.median(errs):6.1%} "
                     f"({len(errs)})")  # fmt: skip
    median = statistics.median(abs(c.error) for c in checks)
    lines.append(
        f"training (forward + backward, workload.py): median abs error {median:.1%} over "
        f"{len(checks)} predictions from {len({c.file for c in checks})} files"
    )
    return lines
