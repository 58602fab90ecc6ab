"""Where one TokenRing call's time goes: kernel time by kind, per call, vs the kernel alone.

  torchrun --nproc_per_node=2 benchmarks/profile_ring_call.py --out $OUT/ring_call_profile.json
For each shape: the graphed TokenRing call (as in ring_sweep.py) timed with CUDA events, then 20
calls under torch.profiler; the kernels are summed by kind (attention, NCCL, merge, copies,
other) and compared with the same per-block cuDNN kernels run alone, back to back, on one GPU.
`attention_inflation` = attention kernel time inside the ring / the same kernels alone: above 1
the NCCL kernels running beside the attention kernel slow it down (they share SMs and memory).
`exposed_ms` = call time - attention time inside the ring: what the overlap did not hide.
`--defer 0 0.5` profiles each shape once per `defer_own` (0: the own block whole at step 0).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch
import torch.distributed as dist
from ring_sweep import SHAPES, time_ms  # noqa: E402  (benchmarks/ is the script's folder)

KINDS = (
    ("attention", ("sdpa", "flash", "fmha", "cudnn", "attn")),
    ("nccl", ("nccl",)),
    ("merge", ("merge", "triton", "logsumexp", "exp", "sigmoid")),
    ("copy", ("copy", "memcpy")),
)


def _kind(name: str) -> str:
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def _kernel_ms(fn, calls: int) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total: dict[str, float] = defaultdict(float)
    for e in prof.events():
        if e.device_type.name == "CUDA":
            total[_kind(e.name)] += e.device_time_total / 1e3 / calls
    return dict(total)


def _profile_shape(
    group, rank: int, n: int, model: str, heads: int, dim: int, tokens: int, defer: float | None
):
    from tokenring_xdit.config import current
    from tokenring_xdit.ring import token_ring_attn
    from tokenring_xdit.ring.kernels import KERNELS
    from tokenring_xdit.ring.layout import get_layout

    gen = torch.Generator(device="cuda").manual_seed(rank)
    q, k, v = (
        torch.randn(1, heads, tokens // n, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
        for _ in range(3)
    )
    lay = get_layout("bhsd")
    cfg = current() if defer is None else current().replace(defer_own=defer)

    def ring():
        return token_ring_attn(q, k, v, group=group, layout="bhsd", kernel="cudnn", config=cfg)

    def blocks_alone():  # the n per-block kernels a rank runs in one ring call
        for _ in range(n):
            KERNELS["cudnn"](q, k, v, dim**-0.5, lay)

    call_ms = time_ms(ring, 50, 10)
    in_ring = _kernel_ms(ring, 20)
    alone = _kernel_ms(blocks_alone, 20)
    row = dict(
        model=model,
        heads=heads,
        head_size=dim,
        tokens=tokens,
        ring=n,
        rank=rank,
        defer_own=cfg.defer_own,
        call_ms=call_ms,
        kernels_in_ring_ms=in_ring,
        attention_alone_ms=alone.get("attention"),
    )
    row["attention_inflation"] = in_ring.get("attention", 0) / alone["attention"]
    row["exposed_ms"] = call_ms - in_ring.get("attention", 0)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", nargs="+", default=["flux:16896", "pixart:16384", "pixart:4096"])
    ap.add_argument("--defer", nargs="+", type=float, default=[None], help="defer_own values")
    args = ap.parse_args()
    from tokenring_xdit.ring import setup_token_ring_group

    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    group = dist.group.WORLD
    setup_token_ring_group(group)
    rows = []
    for model, heads, dim, tokens in SHAPES:
        if f"{model}:{tokens}" not in args.shapes and "all" not in args.shapes:
            continue
        for defer in args.defer:
            rows.append(_profile_shape(group, rank, n, model, heads, dim, tokens, defer))
            if rank == 0:
                print(json.dumps(rows[-1]), flush=True)
    if rank == 0:
        meta = dict(
            gpu=torch.cuda.get_device_name(),
            torch=torch.__version__,
            command="torchrun --nproc_per_node=2 benchmarks/profile_ring_call.py",
        )
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
