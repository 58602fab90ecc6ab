"""Per-block attention kernel time from a calibration table (JSON under planner/data/).

A table is what `benchmarks/calibrate_blocks.py` writes on a GPU, or what
`benchmarks/derive_planner_data.py` derives from the committed single-GPU sweep columns:

    {"meta": {"source": "measured" | "derived", "gpu": "NVIDIA H200", "torch": "...", ...},
     "rows": [{"kernel": "cudnn", "dtype": "bfloat16", "heads": 24, "head_dim": 128,
               "q_len": 4096, "kv_len": 4096, "ms": 0.31}, ...]}

One block = one call of the kernel on (1, heads, q_len, head_dim) queries against kv_len keys,
returning (out, lse). For each (kernel, dtype, heads, head_dim) the rows form a full grid over
q_len x kv_len; times are interpolated linearly in log(ms) over log(q_len), log(kv_len), which
is close to exact for a kernel whose time is a wave count times a kv-length (see docs/planner.md).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
from scipy.interpolate import RegularGridInterpolator

__all__ = ["KernelTable", "load_table", "table_paths", "padded_head_dim", "DATA_DIR"]

DATA_DIR = Path(__file__).with_name("data")
FLASH_HEAD_DIMS = (32, 64, 96, 128, 160, 192, 224, 256)


def padded_head_dim(head_dim: int, kernel: str) -> int:
    """The head dim a kernel really computes with.

    flash-attn (and torch's flash kernel) instantiate 32/64/96/.../256; cuDNN's measured rate at
    d=72 is 0.58x its rate at d=128 (the sweeps' single-GPU columns), i.e. it computes as if d
    were padded to the next multiple of 64.
    """
    if kernel == "flash":
        return next((d for d in FLASH_HEAD_DIMS if d >= head_dim), head_dim)
    return 64 * math.ceil(head_dim / 64)


@dataclass
class _Grid:
    q: np.ndarray
    kv: np.ndarray
    log_ms: np.ndarray  # (len(q), len(kv))

    @cached_property
    def interp(self) -> RegularGridInterpolator:
        # fill_value=None: extrapolate linearly in log-log outside the measured range
        return RegularGridInterpolator(
            (np.log(self.q), np.log(self.kv)), self.log_ms, bounds_error=False, fill_value=None
        )

    def ms(self, q_len: float, kv_len: float) -> float:
        # beyond the longest lengths measured a block is that many more tiles of the same work:
        # time linear in each length (log-log extrapolation of the last cell's cross term grew
        # 128k x 128k blocks by up to 10 % more than 4x the 64k one)
        q_top, kv_top = float(self.q[-1]), float(self.kv[-1])
        if q_len > q_top or kv_len > kv_top:
            q_in, kv_in = min(q_len, q_top), min(kv_len, kv_top)
            return self.ms(q_in, kv_in) * (q_len / q_in) * (kv_len / kv_in)
        value = float(np.exp(self.interp([[math.log(q_len), math.log(kv_len)]])[0]))
        # a kernel never gets faster than the smallest block measured (launch floor)
        return max(value, float(np.exp(self.log_ms.min())))


@dataclass
class KernelTable:
    """Block times for one GPU; `block_ms` answers for any shape (nearest calibrated family)."""

    meta: dict
    grids: dict[tuple[str, str, int, int], _Grid] = field(repr=False)
    path: str = ""

    @classmethod
    def from_dict(cls, data: dict, path: str = "") -> KernelTable:
        groups: dict[tuple[str, str, int, int], dict[tuple[int, int], float]] = {}
        for row in data["rows"]:
            key = (row["kernel"], row["dtype"], int(row["heads"]), int(row["head_dim"]))
            groups.setdefault(key, {})[(int(row["q_len"]), int(row["kv_len"]))] = float(row["ms"])
        grids = {}
        for key, cells in groups.items():
            q = np.array(sorted({a for a, _ in cells}), dtype=float)
            kv = np.array(sorted({b for _, b in cells}), dtype=float)
            missing = [(int(a), int(b)) for a in q for b in kv if (int(a), int(b)) not in cells]
            if missing:
                raise ValueError(f"{path}: {key} is not a full q_len x kv_len grid: {missing[:3]}")
            log_ms = np.log([[cells[(int(a), int(b))] for b in kv] for a in q])
            grids[key] = _Grid(q, kv, log_ms)
        if not grids:
            raise ValueError(f"{path}: calibration table has no rows")
        return cls(meta=data.get("meta", {}), grids=grids, path=path)

    @classmethod
    def from_json(cls, path: str | Path) -> KernelTable:
        with open(path) as f:
            return cls.from_dict(json.load(f), str(path))

    @property
    def gpu(self) -> str:
        return str(self.meta.get("gpu", "unknown"))

    @property
    def derived(self) -> bool:
        return self.meta.get("source") != "measured"

    def kernels(self) -> set[str]:
        return {k for k, *_ in self.grids}

    def block_ms(
        self,
        q_len: float,
        kv_len: float,
        heads: int,
        head_dim: int,
        dtype: str = "bfloat16",
        kernel: str = "cudnn",
    ) -> float:
        """Milliseconds of one (out, lse) kernel call on a (q_len x kv_len) block, batch 1."""
        if q_len <= 0 or kv_len <= 0 or heads <= 0:
            return 0.0
        if kernel not in self.kernels():
            raise ValueError(f"{self.path}: no '{kernel}' rows (has {sorted(self.kernels())})")
        dtypes = {dt for k, dt, *_ in self.grids if k == kernel}
        dt = dtype if dtype in dtypes else sorted(dtypes)[0]
        # nearest calibrated head dim by the dim the kernel really computes with, then scale
        dims = sorted({d for k, t, _, d in self.grids if k == kernel and t == dt})
        pad = padded_head_dim(head_dim, kernel)
        d_near = min(dims, key=lambda d: (abs(padded_head_dim(d, kernel) - pad), d))
        scale = pad / padded_head_dim(d_near, kernel)
        return scale * self._heads_ms(kernel, dt, d_near, heads, q_len, kv_len)

    def _heads_ms(self, kernel: str, dt: str, d: int, heads: int, q: float, kv: float) -> float:
        hs = sorted(h for k, t, h, dd in self.grids if (k, t, dd) == (kernel, dt, d))

        def at(h: int) -> float:
            return self.grids[(kernel, dt, h, d)].ms(q, kv)

        if heads in hs:
            return at(heads)
        lower = [h for h in hs if h < heads]
        upper = [h for h in hs if h > heads]
        if lower and upper:  # linear in heads between two calibrated head counts
            h0, h1 = lower[-1], upper[0]
            w = (heads - h0) / (h1 - h0)
            return (1 - w) * at(h0) + w * at(h1)
        near = lower[-1] if lower else upper[0]
        # outside the calibrated heads: the same block with `heads/near` times the work
        return at(near) * heads / near


def table_paths() -> list[Path]:
    return sorted(DATA_DIR.glob("blocks_*.json"))


def load_table(device_name: str = "NVIDIA H200", path: str | Path | None = None) -> KernelTable:
    """The table for `device_name`: a measured one before a derived one, then any H200 table.

    Matching is by the model in the name ("H100", "H200", ...), as torch.cuda.get_device_name
    writes it; an unknown GPU gets the first table with a note in its meta (`fallback_for`).
    """
    if path is not None:
        return KernelTable.from_json(path)
    tables = [KernelTable.from_json(p) for p in table_paths()]
    if not tables:
        raise FileNotFoundError(f"no calibration table (blocks_*.json) in {DATA_DIR}")
    tokens = [
        t for t in device_name.upper().replace("-", " ").split() if any(c.isdigit() for c in t)
    ]

    def matches(t: KernelTable) -> bool:
        gpu = t.gpu.upper()
        return bool(tokens) and all(tok in gpu for tok in tokens)

    ranked = sorted(tables, key=lambda t: (not matches(t), t.derived, "H200" not in t.gpu.upper()))
    best = ranked[0]
    if not matches(best):
        best.meta = {**best.meta, "fallback_for": device_name}
    return best
