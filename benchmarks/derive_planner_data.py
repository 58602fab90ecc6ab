"""Derive the planner's shipped data files from committed measurements (a development tool, not
part of the installed package; run it from the repository root on any machine, no GPU):

    python benchmarks/derive_planner_data.py          # rewrites tokenring_xdit/planner/data/*

Writes:
  blocks_h200_derived.json  a kernel table derived from the single-GPU columns of the ring
                            sweeps (docs/benchmarks/inference-ring-call-h200-2026-11-22/
                            sweep_*.json: full S x S attention on one H200) and the N x N
                            block-splitting efficiencies measured on one H100 (BLOCK_EFFICIENCY
                            below): a two-parameter wave model is fitted per head
                            dim and evaluated on the calibration grid. Marked "source": "derived";
                            a table from benchmarks/calibrate_blocks.py replaces it.
  fabrics.json              latency/bandwidth per pattern fitted from nccl_peers_*.json
  params.json               overlap cost per MB and host costs (see params.py)
  ceiling_<gpu>.json        the split-block model (planner/ceiling.py) fitted per mask, pass and
                            heads to the kernel ceilings of
                            docs/benchmarks/kernel-ceiling-h200-2026-11-26/*.json
                            (benchmarks/ceiling.py's output; a "seed" file only where no probe
                            file covers the same mask and pass)

Each file records its provenance: this command, and the machine, date and commit of the
measurements it was derived from (MEASURED below; docs/benchmarks/README.md has each folder's
commands).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import re
import statistics
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from tokenring_xdit.planner.calibration import DATA_DIR, padded_head_dim
from tokenring_xdit.planner.ceiling import fit_split_model
from tokenring_xdit.planner.fabric import fit_nccl_peers

__all__ = ["wave_ms", "fit_wave_model", "derived_ceilings", "main"]

COMMAND = "python benchmarks/derive_planner_data.py"
# the committed measurements each file is derived from (folders of docs/benchmarks/)
SWEEPS = "inference-ring-call-h200-2026-11-22"  # ring sweeps, link probes, ring-call profiles
E2E = "end-to-end-h200-2026-11-22"  # PixArt end to end and its profiler tables
PIECES = "last-return-pieces-h200-2026-11-22"  # the last return in 1-16 pieces
CEILING = "kernel-ceiling-h200-2026-11-26"  # kernel ceilings of split attention
MEASURED = {
    SWEEPS: {"machine": "2 x H200 and 4 x H200, NVLink NV18, torch 2.11.0+cu130",
             "date": "2026-11-22", "commit": "9270ea3 (2 x H200), 841433f (4 x H200)"},
    E2E: {"machine": "2 x H200, NVLink NV18, torch 2.11.0+cu130", "date": "2026-11-22",
          "commit": "2771f3c"},
    PIECES: {"machine": "4 x H200, NVLink NV18, torch 2.11.0+cu130", "date": "2026-11-22",
             "commit": "4a96765"},
    CEILING: {"machine": "one H200, torch 2.11.0+cu130", "date": "2026-11-26",
              "commit": "de64655"},
}  # fmt: skip


def provenance(*folders: str) -> dict:
    """How a derived file is made again, and where, when and on what code its inputs ran."""
    return {
        "command": COMMAND,
        "measured": [{"folder": f"docs/benchmarks/{f}", **MEASURED[f]} for f in folders],
    }


SMS = 132  # H100/H200 SXM streaming multiprocessors
Q_TILE = 128  # query rows per CTA in the Hopper attention kernels
GRID_LENS = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]
GRID_HEADS = [8, 16, 24, 32, 40]
GRID_DIMS = [64, 72, 128]
# flash (torch's flash kernel, yunchang's torch backend) vs cuDNN at d=128, both returning lse,
# bf16, one H200: 265-358 vs 450-680 TFLOP/s (a one-off probe); ratio of the midpoints.
FLASH_OVER_CUDNN_128 = (450 + 680) / (265 + 358)
# Per-rank compute efficiency of splitting one attention into N x N blocks (one H100, cuDNN, bf16,
# Flux 24 x 128; a one-off probe): tokens -> {N: single / (N^2 * block)}.
BLOCK_EFFICIENCY = {
    4096: {2: 0.92, 4: 0.61, 8: 0.36},
    16384: {2: 1.06, 4: 0.94, 8: 0.88, 16: 0.63},
    65536: {2: 0.99, 4: 0.92, 8: 0.96, 16: 0.93, 32: 0.86, 64: 0.56},
}


def _waves(heads: float, q_len: float) -> float:
    return math.ceil(heads * math.ceil(q_len / Q_TILE) / SMS)


def wave_ms(q_len: float, kv_len: float, heads: int, t0: float, c: float, a: float) -> float:
    """Block time = launch floor + waves of CTAs x (per-CTA fixed cost a + c * kv / 1e6).

    a is what a CTA pays whatever its kv length (load its Q tile, write out and lse): the reason
    many short blocks cost more than one long one with the same FLOPs.
    """
    return t0 + _waves(heads, q_len) * (a + c * kv_len / 1e6)


def _single_rows(bench_dir: Path) -> list[tuple[int, int, int, float]]:
    """(heads, head_dim, tokens, ms) of every single-GPU column, averaged per shape."""
    seen: dict[tuple[int, int, int], list[float]] = {}
    for path in sorted(glob.glob(str(bench_dir / SWEEPS / "sweep_*.json"))):
        with open(path) as f:
            data = json.load(f)
        if "H200" not in data.get("meta", {}).get("gpu", ""):
            continue
        for row in data["rows"]:
            if row.get("single_ms"):
                key = (row["heads"], row["head_size"], row["tokens"])
                seen.setdefault(key, []).append(row["single_ms"])
    return [(*k, statistics.median(v)) for k, v in sorted(seen.items())]


def fit_wave_model(
    rows: list[tuple[int, int, int, float]],
) -> dict[int, tuple[float, float, float]]:
    """Fit a shared floor t0 and per-CTA cost a, and a kv rate c per head dim: {d: (t0, c, a)}."""
    dims = sorted({d for _, d, _, _ in rows})

    def residuals(x: np.ndarray) -> np.ndarray:
        t0, a, c = x[0], x[1], dict(zip(dims, x[2:], strict=True))
        # the single-GPU rows fix the large-block rate
        res = [math.log(wave_ms(s, s, h, t0, c[d], a) / ms) for h, d, s, ms in rows]
        for tokens, by_n in BLOCK_EFFICIENCY.items():  # the block splits fix the floor
            single = wave_ms(tokens, tokens, 24, t0, c[128], a)
            for n, eff in by_n.items():
                block = wave_ms(tokens / n, tokens / n, 24, t0, c[128], a)
                res.append(math.log(block * n * n * eff / single))
        return np.array(res)

    x0 = np.array([0.005, 0.001] + [10.0] * len(dims))
    fit = least_squares(residuals, x0, bounds=(0, np.inf), x_scale="jac")
    t0, a = float(fit.x[0]), float(fit.x[1])
    return {d: (t0, float(c), a) for d, c in zip(dims, fit.x[2:], strict=True)}


def derived_table(bench_dir: Path) -> dict:
    rows_in = _single_rows(bench_dir)
    model = fit_wave_model(rows_in)
    rows = []
    for kernel in ("cudnn", "flash"):
        for d in GRID_DIMS:
            # nearest fitted dim, scaled by the dim the kernel computes with (padding)
            d_fit = min(
                model, key=lambda x: abs(padded_head_dim(x, "cudnn") - padded_head_dim(d, "cudnn"))
            )
            t0, per, a = model[d_fit]
            per *= padded_head_dim(d, "cudnn") / padded_head_dim(d_fit, "cudnn")
            if kernel == "flash":
                per *= (
                    FLASH_OVER_CUDNN_128
                    * padded_head_dim(d, "flash")
                    / 128
                    / (padded_head_dim(d, "cudnn") / 128)
                )
            for h in GRID_HEADS:
                for q in GRID_LENS:
                    for kv in GRID_LENS:
                        ms = wave_ms(q, kv, h, t0, per, a)
                        rows.append(
                            dict(kernel=kernel, dtype="bfloat16", heads=h, head_dim=d,
                                 q_len=q, kv_len=kv, ms=round(ms, 6))
                        )  # fmt: skip
    resid = [wave_ms(s, s, h, *model[d]) / ms - 1 for h, d, s, ms in rows_in]
    meta = {
        "source": "derived",
        "gpu": "NVIDIA H200",
        "dtype": "bfloat16",
        "layout": "bhsd, batch 1",
        "derived_from": [
            f"single_ms columns of docs/benchmarks/{SWEEPS}/sweep_*.json (one H200, full S x S, "
            "cuDNN)",
            "N x N block-splitting efficiencies, one H100, cuDNN (a one-off probe)",
            "flash/cuDNN rate ratio at d=128 (a one-off probe), flash pads d to 32/64/96/128",
        ],
        "model": "ms = t0 + ceil(heads * ceil(q/128) / 132) * (a + c[d] * kv / 1e6)",
        "fit": {str(d): {"t0_ms": t0, "c_ms": c, "a_ms": a} for d, (t0, c, a) in model.items()},
        "fit_max_rel_error_single_rows": round(max(abs(r) for r in resid), 4),
        "note": "derived, not measured: replace with benchmarks/calibrate_blocks.py output",
        "provenance": provenance(SWEEPS),
    }
    return {"meta": meta, "rows": rows}


def _profile_op_us(path: Path, op: str) -> float:
    """'CPU time avg' of one op in a torch.profiler key_averages table (microseconds)."""
    for line in path.read_text().splitlines():
        cols = line.split()
        if cols and cols[0] == op:
            avg = cols[-6]  # Name, Self CPU %, Self CPU, CPU total %, CPU total, CPU time avg, ...
            value = float(re.sub(r"[a-z]+$", "", avg))
            return value * (1000.0 if avg.endswith("ms") else 1.0)
    raise ValueError(f"{path}: op {op} not in the table")


def overlap_us_per_mb(bench_dir: Path) -> tuple[float, list[float]]:
    """Attention-kernel time lost per MB that NCCL moves beside it, from the graphed ring-2 calls
    of ring_call_profile_2xH200.json and nccl_ctas/*.json (NCCL_MAX_NCTAS 1-8 and unset).

    Each row: kernel time inside the ring minus the same kernels alone, where "the same kernels"
    is corrected with the measured block table for the last block being cut into pieces (the
    original code: one piece per 1024 local queries, at most 4); divided by the bytes the rank
    sent while its kernels ran: Q (step 0) and all pieces of the last partial but the last one.
    Returns the median and the per-row values (microseconds per 1e6 bytes).
    """
    from tokenring_xdit.planner.calibration import load_table
    from tokenring_xdit.planner.schedules import LSE_BYTES, old_final_pieces

    table = load_table("NVIDIA H200")
    files = [bench_dir / SWEEPS / "ring_call_profile_2xH200.json"]
    files += sorted((bench_dir / SWEEPS / "nccl_ctas").glob("ring_call_profile_ctas_*.json"))
    values = []
    for path in files:
        with open(path) as f:
            rows = json.load(f)["rows"]
        for r in rows:
            n, h, d = r["ring"], r["heads"], r["head_size"]
            q = r["tokens"] // n
            p = old_final_pieces(q)
            full = table.block_ms(q, q, h, d)
            piece = table.block_ms(q / p, q, h, d)
            same_alone = r["attention_alone_ms"] * ((n - 1) * full + p * piece) / (n * full)
            extra = r["kernels_in_ring_ms"]["attention"] - same_alone
            q_bytes = q * h * d * 2
            partial = q_bytes + q * h * LSE_BYTES
            sent = (n - 1) * q_bytes + max(n - 2, 0) * partial + partial * (p - 1) / p
            values.append(extra * 1e3 / (sent / 1e6))
    return statistics.median(values), values


def derived_params(bench_dir: Path) -> dict:
    beta, per_row = overlap_us_per_mb(bench_dir)
    profiles = bench_dir / E2E / "profiles"
    one = profiles / "profile_pixart1024_one_gpu.txt"
    first = json.loads(one.read_text().splitlines()[0])
    with open(bench_dir / E2E / "e2e_pixart_2xH200.json") as f:
        e2e = next(r for r in json.load(f)["rows"] if r["size"] == 1024)
    # the profiler slows the host; measure how much on the same run without it
    profiler_slowdown = (first["wall_s"] / first["steps"]) / (e2e["one_gpu_s"] / e2e["steps"])
    elementwise = statistics.median(
        _profile_op_us(one, op) for op in ("aten::add", "aten::mul", "aten::sub", "aten::copy_")
    )
    tr_eager = profiles / "profile_pixart1024_token_ring_rank0.txt"
    host = {
        "attention": _profile_op_us(one, "aten::_scaled_dot_product_cudnn_attention"),
        "comm": _profile_op_us(
            profiles / "profile_pixart1024_default_rank0.txt", "record_param_comms"
        ),
        "elementwise": elementwise,
        "graph": _profile_op_us(tr_eager, "cudaGraphLaunch"),
    }
    return {
        "overlap_us_per_mb": round(beta, 3),
        "overlap_us_per_mb_rows": [round(v, 2) for v in per_row],
        "host_us": {k: round(v / profiler_slowdown, 2) for k, v in host.items()},
        "profiler_slowdown": round(profiler_slowdown, 4),
        "sources": {
            "overlap_us_per_mb": "ring_call_profile_2xH200.json + nccl_ctas/*.json: kernel time "
            "in the ring - the same kernels alone (piece-corrected with the measured table), per "
            "MB sent under them; median of the rows",
            "host_us": f"CPU time avg per call, docs/benchmarks/{E2E}/profiles/*.txt / "
            "profiler_slowdown",
            "profiler_slowdown": "profiled one-GPU PixArt step / unprofiled (e2e_pixart_2xH200)",
        },
        "provenance": provenance(SWEEPS, E2E),
    }


def device_latency_ms(bench_dir: Path) -> float:
    """GPU-side cost of one more P2P transfer: graphed TokenRing calls that return the last
    partial in 16 pieces instead of 1 (final_chunks/*.json, smallest shapes, where the data
    moved is small): (t16 - t1) / 15, median. An upper bound (it includes a kernel split)."""
    slopes = []
    for path in sorted(glob.glob(str(bench_dir / PIECES / "final_chunks_*xH200.json"))):
        with open(path) as f:
            for row in json.load(f)["rows"]:
                if row["tokens"] <= 4608 and row.get("chunks_16_ms"):
                    slopes.append((row["chunks_16_ms"] - row["chunks_1_ms"]) / 15)
    return statistics.median(slopes)


def derived_fabrics(bench_dir: Path) -> dict:
    # which committed measurement stands for which named fabric
    names = {
        "nvswitch": "nccl_peers_4xH200_nvlink.json",
        "nvlink-pair": "nccl_peers_2xH200_nvlink.json",
        "p2p-off": "nccl_peers_4xH200_p2p_off.json",
        "p2p-off-pair": "nccl_peers_2xH200_p2p_off.json",
    }
    fabrics = []
    latency = device_latency_ms(bench_dir)
    for name, file in names.items():
        fab = fit_nccl_peers(bench_dir / SWEEPS / file, name=name, latency_ms=latency)
        entry = fab.to_dict()
        entry["source"] = (
            f"bandwidth: docs/benchmarks/{SWEEPS}/{file}; latency: {PIECES} (graphed extra "
            "transfer)"
        )
        fabrics.append(entry)
    return {"fabrics": fabrics, "provenance": provenance(SWEEPS, PIECES)}


def derived_ceilings(bench_dir: Path) -> dict[str, dict]:
    """{gpu file tag: ceiling table} fitted to every ceiling/*.json row of a full or causal mask
    (probe rows first: a seed file's rows count only for keys no probe file has)."""
    groups: dict[tuple, list] = {}
    seeds: dict[tuple, list] = {}
    for path in sorted(glob.glob(str(bench_dir / CEILING / "*.json"))):
        data = json.loads(Path(path).read_text())
        meta = data.get("meta", data)
        device = meta.get("device", "NVIDIA H200")
        tag = next((w for w in device.upper().split() if any(c.isdigit() for c in w)), "H200")
        into = seeds if meta.get("source") == "seed" else groups
        for r in data["rows"]:
            if r["mask"] not in ("full", "causal") or r.get("ceiling") is None:
                continue
            key = (tag.lower(), r["mask"], r["pass"], r["heads"], r["kv_heads"], r["head_dim"])
            point = (r["ring"], r["tokens"], r["ceiling"], Path(path).name)
            into.setdefault(key, []).append(point)
    covered = {k[:3] for k in groups}
    for key, points in seeds.items():
        if key[:3] not in covered:
            groups[key] = points
    tables: dict[str, dict] = {}
    for key in sorted(groups):
        tag, mask, pass_, heads, kv_heads, head_dim = key
        points = groups[key]
        if len({(n, s) for n, s, _, _ in points}) < 2:
            continue
        causal, train = mask == "causal", pass_ == "fwd+bwd"
        model = fit_split_model([p[:3] for p in points], causal, train)
        resid = [model.ceiling(n, s, causal, train) - c for n, s, c, _ in points]
        table = tables.setdefault(tag, {"meta": {}, "fits": []})
        table["fits"].append(
            dict(mask=mask, pass_=pass_, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                 lam=model.lam, mu=model.mu, max_abs_residual=round(max(map(abs, resid)), 4),
                 points=[[n, s, c] for n, s, c, _ in points],
                 sources=sorted({src for *_, src in points}))
        )  # fmt: skip
        table["meta"] = {
            "source": "derived",
            "gpu": tag.upper(),
            "model": "block cost in pair units = pairs + lam * (q_len + kv_len) + mu; ceiling = "
            "whole / N / busiest rank's sum over rank_blocks (tokenring_xdit/planner/ceiling.py)",
            "command": COMMAND,
            "provenance": provenance(CEILING),
        }
    for table in tables.values():  # "pass" is the JSON key (pass_ above: a Python keyword)
        table["fits"] = [{("pass" if k == "pass_" else k): v for k, v in f.items()}
                         for f in table["fits"]]  # fmt: skip
    return tables


def _dump(path: Path, data: dict) -> None:
    with open(path, "w") as f:
        if "rows" in data:  # tables: one row per line keeps diffs readable and the file small
            rows = ",\n ".join(json.dumps(r) for r in data["rows"])
            f.write(f'{{"meta": {json.dumps(data["meta"], indent=1)},\n "rows": [\n {rows}\n]}}')
        elif "fits" in data:  # one fit per line
            fits = ",\n ".join(json.dumps(r) for r in data["fits"])
            f.write(f'{{"meta": {json.dumps(data["meta"], indent=1)},\n "fits": [\n {fits}\n]}}')
        else:
            json.dump(data, f, indent=1)
        f.write("\n")
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench-dir", default="docs/benchmarks")
    ap.add_argument("--out-dir", default=str(DATA_DIR))
    args = ap.parse_args(argv)
    bench, out = Path(args.bench_dir), Path(args.out_dir)
    _dump(out / "blocks_h200_derived.json", derived_table(bench))
    _dump(out / "fabrics.json", derived_fabrics(bench))
    _dump(out / "params.json", derived_params(bench))
    for tag, table in derived_ceilings(bench).items():
        _dump(out / f"ceiling_{tag}.json", table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
