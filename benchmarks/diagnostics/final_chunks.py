"""How many pieces should the last partial's return be cut into? One graphed TokenRing call per
`final_chunks` value, same inputs, ms per call (the slowest rank's).

  torchrun --nproc_per_node=N benchmarks/diagnostics/final_chunks.py --out $OUT/final_chunks.json
`default` in each row is the piece count a call without `final_chunks` used when it ran (the
original rule: one piece per 1024 local queries, at most 4; since then 1, or
TOKENRING_XDIT_FINAL_CHUNKS). Shapes and timing as in ring_sweep.py.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tokenring_xdit import config
from tokenring_xdit.ring import setup_token_ring_group, token_ring_attn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the sweep's shapes
from ring_sweep import SHAPES, time_ms  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--chunks", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--max-tokens", type=int, default=32768)
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    setup_token_ring_group(dist.group.WORLD)
    rows = []
    for model, heads, d, total in SHAPES:
        if total > args.max_tokens:
            continue
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (
            torch.randn(1, heads, total // n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(3)
        )
        row = {"model": model, "tokens": total, "ring": n}
        row["default"] = config.current().final_chunks
        for c in args.chunks:
            call = functools.partial(
                token_ring_attn, q, k, v, layout="bhsd", kernel="cudnn", final_chunks=c
            )
            row[f"chunks_{c}_ms"] = time_ms(call, iters=30, warmup=5)
        if rank == 0:
            print(
                json.dumps(
                    {key: round(x, 4) if isinstance(x, float) else x for key, x in row.items()}
                )
            )
        rows.append(row)
    if rank == 0:
        meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "ranks": n}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
