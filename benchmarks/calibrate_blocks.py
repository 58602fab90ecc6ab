"""Per-block attention kernel times for the planner's calibration table (one GPU, < 4 minutes).

    python benchmarks/calibrate_blocks.py --out $OUT/blocks_h100.json
then commit the file as tokenring_xdit/planner/data/blocks_<gpu>.json (the loader prefers a
measured table over the derived one for the same GPU).
Times one (out, lse) call per block, bf16, (1, heads, q_len, head_dim) x (1, heads, kv_len,
head_dim), non-causal, CUDA events around `--iters` back-to-back calls, after `--warmup` calls:
  cudnn  torch.ops.aten._scaled_dot_product_cudnn_attention (TokenRing, xDiT, torch's ring)
  flash  torch.ops.aten._scaled_dot_product_flash_attention (yunchang's torch backend)
Output format: tokenring_xdit/planner/calibration.py (meta + one row per block).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

import torch

LENS = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]
HEAD_DIMS = [64, 72, 128]
HEADS = [16, 24, 32]
BUDGET_S = 220  # stay under 4 minutes: the largest blocks are skipped if time runs out


def _cudnn(q, k, v, scale):
    return torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, False, False, scale=scale
    )


def _flash(q, k, v, scale):
    return torch.ops.aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, False, False, scale=scale
    )


KERNELS = {"cudnn": _cudnn, "flash": _flash}


def _iters(q_len: int, kv_len: int, heads: int) -> int:
    # ~constant timed work per block: many calls for small blocks, few for large ones
    work = q_len * kv_len * heads
    return max(3, min(50, int(4e11 / work)))


def time_block(fn, q, k, v, scale, iters: int, warmup: int) -> float:
    for _ in range(warmup):
        fn(q, k, v, scale)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn(q, k, v, scale)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def _commit() -> str:
    """The checkout's commit the table was measured on (provenance), or "unknown"."""
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent)  # fmt: skip
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    args = ap.parse_args()
    dev = torch.device("cuda")
    t_start = time.monotonic()
    rows, skipped = [], []
    big = torch.randn(1, max(HEADS), max(LENS), max(HEAD_DIMS), device=dev, dtype=torch.bfloat16)
    for kernel in args.kernels:
        fn = KERNELS[kernel]
        for d in HEAD_DIMS:
            for h in HEADS:
                for q_len in LENS:
                    for kv_len in LENS:
                        if time.monotonic() - t_start > BUDGET_S:
                            skipped.append((kernel, d, h, q_len, kv_len))
                            continue
                        # views of one buffer: no allocation per block; contiguous per head
                        q = big[:, :h, :q_len, :d].contiguous()
                        k = big[:, :h, :kv_len, :d].contiguous()
                        v = k.clone()
                        ms = time_block(fn, q, k, v, d**-0.5, _iters(q_len, kv_len, h), args.warmup)
                        rows.append(
                            dict(kernel=kernel, dtype="bfloat16", heads=h, head_dim=d,
                                 q_len=q_len, kv_len=kv_len, ms=round(ms, 6))
                        )  # fmt: skip
                        del q, k, v
                print(f"{kernel} d={d}: done at {time.monotonic() - t_start:.0f} s", flush=True)
    meta = {
        "source": "measured",
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "dtype": "bfloat16",
        "layout": "bhsd, batch 1, non-causal",
        "timing": f"CUDA events, {args.warmup} warm-up calls excluded",
        "command": "python benchmarks/calibrate_blocks.py",
        "commit": _commit(),
        "machine": f"one {torch.cuda.get_device_name()}",
        "host": platform.node(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "seconds": round(time.monotonic() - t_start, 1),
        "skipped_for_time": len(skipped),
    }
    if skipped:  # the loader needs full grids: drop any family the budget cut short
        cut = {(k, d, h) for k, d, h, *_ in skipped}
        rows = [r for r in rows if (r["kernel"], r["head_dim"], r["heads"]) not in cut]
        meta["families_dropped"] = sorted(cut)
    with open(args.out, "w") as f:
        rows_text = ",\n ".join(json.dumps(r) for r in rows)
        f.write(f'{{"meta": {json.dumps(meta, indent=1)},\n "rows": [\n {rows_text}\n]}}\n')
    print(f"wrote {args.out}: {len(rows)} blocks in {meta['seconds']} s")


if __name__ == "__main__":
    main()
