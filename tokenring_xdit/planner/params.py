"""The few scalar parameters of the cost model, and where each one comes from.

`data/params.json` is written by `python benchmarks/derive_planner_data.py` from committed files
that are NOT the ring timings the validation predicts:
  overlap_us_per_mb  microseconds an attention kernel loses per MB (1e6 bytes) that its rank
                     sends (and receives) over NCCL while it runs: kernel time inside graphed
                     ring-2 calls minus the same kernels alone, per MB moved under them, median
                     of ring_call_profile_2xH200.json and nccl_ctas/*.json
  host_us            CPU cost of issuing one op from Python (eager): per-call "CPU total" of the
                     attention op, of a NCCL call (record_param_comms), of an elementwise op, and
                     of a CUDA-graph launch, from the torch.profiler tables under
                     docs/benchmarks/end-to-end-h200-2026-11-22/profiles/, divided by the
                     profiler's own slow-down
                     (profiled vs unprofiled one-GPU PixArt step time, e2e_pixart_2xH200.json)
Memory-bound ops (merges, layout copies) use the GPU's HBM bandwidth from its data sheet.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ModelParams", "load_params", "hbm_gbps"]

DATA_FILE = Path(__file__).with_name("data") / "params.json"

# Data-sheet HBM bandwidth, GB/s; memory-bound kernels reach ~80 % of it (typical for copies).
_HBM_GBPS = {"H200": 4800, "H100": 3350, "H20": 4000, "A100": 2039, "L40": 864, "A10": 600}
_HBM_EFFICIENCY = 0.8


def hbm_gbps(device_name: str) -> float:
    name = device_name.upper()
    for key in sorted(_HBM_GBPS, key=len, reverse=True):
        if key in name:
            return _HBM_GBPS[key] * _HBM_EFFICIENCY
    return _HBM_GBPS["H100"] * _HBM_EFFICIENCY


@dataclass(frozen=True)
class ModelParams:
    overlap_us_per_mb: float = 4.3
    host_us: dict[str, float] = field(
        default_factory=lambda: {
            "attention": 60.0,
            "comm": 54.0,
            "elementwise": 11.0,
            "graph": 33.0,
        }
    )
    sources: dict[str, str] = field(default_factory=dict)


def load_params(path: str | Path | None = None) -> ModelParams:
    path = Path(path) if path else DATA_FILE
    if not path.exists():
        return ModelParams(sources={"all": "built-in defaults (data/params.json missing)"})
    with open(path) as f:
        data = json.load(f)
    return ModelParams(
        overlap_us_per_mb=float(data["overlap_us_per_mb"]),
        host_us={k: float(v) for k, v in data["host_us"].items()},
        sources=data.get("sources", {}),
    )
