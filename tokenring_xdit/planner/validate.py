"""`plan --validate`: predict every committed ring-sweep row and score the predictions.

Every `sweep_*.json` of the checkout's `docs/benchmarks/inference-ring-call-h200-2026-11-22/` is
read (in an installed copy, the snapshot the wheel ships under planner/data/sweeps/; `--bench-dir`
picks another folder). Each row's machine is rebuilt from its meta (GPU, ranks, NCCL_P2P_DISABLE,
nodes) with the fabric fitted from the nccl_peers file of the same host kind. Scores:
  error      |predicted / measured - 1| per (row, method); the median is reported
  best pick  per row, the method the planner ranks first among the measured ones is "right" when
             its measured time is within PICK_TOLERANCE of the measured best (run-to-run spread
             of one shape on one host is 1-4 %)
Nothing here is fitted on these rows (params.py, benchmarks/derive_planner_data.py).
"""

from __future__ import annotations

import glob
import json
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from .cost import predict
from .fabric import Fabric, fit_nccl_peers
from .machine import make_machine
from .schedules import old_final_pieces, sweep_options

__all__ = [
    "Check",
    "validate",
    "report",
    "default_bench_dir",
    "SWEEPS_DIR",
    "MAX_MEDIAN_ERROR",
    "MIN_PICK_RATE",
    "PICK_TOLERANCE",
]

MAX_MEDIAN_ERROR = 0.15
MIN_PICK_RATE = 0.90
PICK_TOLERANCE = 0.05
PICK_METHODS = ("token_ring", "torch_ag", "yunchang_p2p", "ulysses")
TIMED = ("token_ring", "token_ring_eager", "torch_ag", "yunchang_p2p", "ulysses")
# TokenRing returned its last block in min(4, q_local // 1024) pieces until commit 4a96765
# (docs/performance.md, design decisions); sweeps timed before it are predicted with that rule
ONE_PIECE_SINCE = "2026-11-22 07:10"


def _final_pieces(meta: dict, q_local: int) -> int:
    if str(meta.get("time", "")) >= ONE_PIECE_SINCE:
        return 1
    return old_final_pieces(q_local)


@dataclass
class Check:
    file: str
    model: str
    tokens: int
    ulysses: int
    ring: int
    method: str
    measured_ms: float
    predicted_ms: float

    @property
    def error(self) -> float:
        return self.predicted_ms / self.measured_ms - 1.0


def _fabric_for(meta: dict, ranks: int) -> str:
    """The named fabric whose nccl_peers measurement was taken on the same kind of host."""
    p2p_off = str(meta.get("nccl_p2p_disable", "0")) == "1"
    pair = ranks == 2 and "of" not in meta.get("command", "") and "CUDA_VISIBLE" not in str(meta)
    if p2p_off:
        return "p2p-off-pair" if ranks == 2 else "p2p-off"
    return "nvlink-pair" if pair else "nvswitch"


def _file_fabric(path: str, meta: dict, ranks: int) -> str:
    # 2 of the 4 NVSwitch GPUs (sweep_2of4...) are still behind the switch
    if "2of4" in Path(path).name and str(meta.get("nccl_p2p_disable", "0")) != "1":
        return "nvswitch"
    return _fabric_for(meta, ranks)


PACKAGE_DIR = Path(__file__).resolve().parents[1]


def sweep_files(bench_dir: str | Path) -> list[str]:
    return sorted(glob.glob(str(Path(bench_dir) / "sweep_*.json")))


# what must match between a stand-in sweep and the link probe of the same launch settings
_LAUNCH_KEYS = ("nodes", "gpus_per_node", "nccl_socket_nthreads", "nccl_nsocks_perthread")


def _probe_for(path: str, launch: dict) -> Fabric:
    """The inter-node link of a multi-node sweep: fitted from the nccl_peers probe beside it
    that the launcher ran with the same settings (benchmarks/multi_node.py stamps both)."""
    key = [launch.get(k) for k in _LAUNCH_KEYS]
    for probe in sorted(Path(path).parent.glob("nccl_peers*.json")):
        with open(probe) as f:
            stamped = json.load(f).get("meta", {}).get("multi_node", {})
        if [stamped.get(k) for k in _LAUNCH_KEYS] == key:
            fitted = fit_nccl_peers(probe)
            return replace(fitted, name=f"network ({probe.name})")
    raise FileNotFoundError(f"{path}: no nccl_peers*.json beside it launched with {key}")


def _machine(path: str, meta: dict, ranks: int):
    """The machine a sweep ran on: one node (fabric from the host kind), or the stand-in's
    nodes with the probed link between them."""
    launch = meta.get("multi_node")
    if not launch:
        return make_machine(ranks, fabric_name=_file_fabric(path, meta, ranks), gpu=meta["gpu"])
    g = int(launch["gpus_per_node"])
    intra = "nvlink-pair" if g <= 2 else "nvswitch"
    return make_machine(ranks, ranks // g, intra, _probe_for(path, launch), gpu=meta["gpu"])


def _label(path: str) -> str:
    p = Path(path)
    return f"{p.parent.name}/{p.name}" if p.parent.name.startswith("across-nodes-") else p.name


# the checkout's ring sweeps that `plan --validate` scores by default (hatch_build.py ships them)
SWEEPS_DIR = Path("docs", "benchmarks", "inference-ring-call-h200-2026-11-22")


def default_bench_dir(package_dir: Path = PACKAGE_DIR) -> Path:
    """The sweeps `plan --validate` reads without --bench-dir: the checkout the package runs from
    (source tree or editable install), else the copy shipped in the wheel."""
    candidates = (
        package_dir.parent / SWEEPS_DIR,
        package_dir / "planner" / "data" / "sweeps",
    )
    for candidate in candidates:
        if sweep_files(candidate):
            return candidate
    raise FileNotFoundError(
        f"no sweep_*.json in {' or '.join(map(str, candidates))}: this copy ships no sweeps; "
        f"pass --bench-dir <checkout>/{SWEEPS_DIR.as_posix()} (git clone of tokenring-xdit)"
    )


def validate(
    bench_dir: str | Path | None = None,
) -> tuple[list[Check], list[tuple[str, str, int, bool, bool]]]:
    """(every per-method check, per row (file, model, tokens, pick right, strict pick right))."""
    checks: list[Check] = []
    picks = []
    for path in sweep_files(default_bench_dir() if bench_dir is None else bench_dir):
        with open(path) as f:
            data = json.load(f)
        meta = data.get("meta", {})
        for row in data["rows"]:
            u = int(row.get("ulysses", 1))
            ranks = int(row.get("ranks", u * row["ring"]))
            m = _machine(path, meta, ranks)
            # first-version files timed TokenRing eagerly and had no eager column
            columns = {k: k for k in TIMED}
            if "token_ring_eager_ms" not in row and "token_ring_ms" in row:
                columns["token_ring"] = "token_ring_eager"
            row_checks = {}
            for column, method in columns.items():
                measured = row.get(f"{column}_ms")
                if not measured:
                    continue
                uu, rr = (ranks, 1) if method == "ulysses" else (u, int(row["ring"]))
                pieces = _final_pieces(meta, row["tokens"] // (uu * rr))
                p = predict(
                    m, method, row["heads"], row["head_size"], row["tokens"], uu, rr,
                    final_pieces=pieces, options=sweep_options(str(meta.get("time", ""))),
                )  # fmt: skip
                c = Check(_label(path), row["model"], row["tokens"], uu, rr, column, measured, p.ms)
                checks.append(c)
                row_checks[method] = c
            cands = {k: c for k, c in row_checks.items() if k in PICK_METHODS}
            if len(cands) >= 2:
                pick = min(cands.values(), key=lambda c: c.predicted_ms)
                best = min(c.measured_ms for c in cands.values())
                right = pick.measured_ms <= best * (1 + PICK_TOLERANCE)
                picks.append(
                    (_label(path), row["model"], row["tokens"], right, pick.measured_ms == best)
                )
    return checks, picks


def report(bench_dir: str | Path | None = None, verbose: bool = False) -> tuple[str, bool]:
    """The text `plan --validate` prints, and whether the targets are met. Raises
    FileNotFoundError when the folder holds no sweep file."""
    bench_dir = default_bench_dir() if bench_dir is None else Path(bench_dir)
    checks, picks = validate(bench_dir)
    if not checks:
        raise FileNotFoundError(f"no sweep_*.json rows under {bench_dir}")
    lines = []
    if verbose:
        lines.append(
            f"{'file':32} {'model':6} {'tokens':>6} UxR  {'method':17} meas_ms pred_ms  err"
        )
        for c in checks:
            lines.append(
                f"{c.file:32} {c.model:6} {c.tokens:6} {c.ulysses}x{c.ring}  {c.method:17} "
                f"{c.measured_ms:7.3f} {c.predicted_ms:7.3f} {c.error:+5.0%}"
            )
    by_method: dict[str, list[float]] = {}
    for c in checks:
        by_method.setdefault(c.method, []).append(abs(c.error))
    for method, errs in sorted(by_method.items()):
        lines.append(f"  {method:17} median abs error {statistics.median(errs):6.1%} ({len(errs)})")
    median = statistics.median(abs(c.error) for c in checks)
    right = sum(p[3] for p in picks)
    strict = sum(p[4] for p in picks)
    lines.append(
        f"{len(checks)} predictions from {len({c.file for c in checks})} files in {bench_dir}"
    )
    lines.append(
        f"best pick right (its measured time within {PICK_TOLERANCE:.0%} of the row's measured "
        f"best) in {right} of {len(picks)} rows; the measured best itself in {strict}"
    )
    lines.append(
        "fitted on these rows: nothing (kernel table: calibrate_blocks.py on one H200; fabrics: "
        "nccl_peers + final_chunks; overlap per MB: ring_call_profile + nccl_ctas; host: "
        "profiler tables; TokenRing's last block in the pieces the code used when each sweep ran)"
    )
    lines.append(
        f"median abs error {median:.1%}, best pick right in {right} of {len(picks)} "
        f"(within {PICK_TOLERANCE:.0%} of the measured best)"
    )
    ok = median <= MAX_MEDIAN_ERROR and right >= MIN_PICK_RATE * len(picks)
    return "\n".join(lines), ok
