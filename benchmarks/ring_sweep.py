"""Ring-dimension sweep: TokenRing vs the baselines, one attention call, in one run.

Launch on the GPU machine (ring degree = number of GPUs / --ulysses):
  torchrun --nproc_per_node=2 benchmarks/ring_sweep.py --out $OUT/sweep_nvlink.json
  NCCL_P2P_DISABLE=1 torchrun --nproc_per_node=2 benchmarks/ring_sweep.py \
      --out $OUT/sweep_p2p_off.json
  torchrun --nproc_per_node=4 benchmarks/ring_sweep.py --ulysses 2 --out $OUT/sweep_2x2.json
With --ulysses U every ring method runs as USP does it: an all-to-all over U consecutive ranks
(heads -> sequence), the ring over the N/U ranks of stride U, and the all-to-all back; all
methods pay the same all-to-alls. `ulysses` stays the pure all-ranks baseline.
Methods (bf16, (b, h, s, d), non-causal, cuDNN per block where the method takes a kernel):
  single        one GPU, full sequence; ideal = single / N
  token_ring    tokenring_xdit.token_ring_attn (replayed as a CUDA graph, the default)
  token_ring_eager  the same without CUDA graphs
  token_ring_whole_own  graphed, the own block whole at step 0 (defer_own=0: the last return
                    travels in the open; the default `auto` holds back a share of it from 2048
                    local queries to hide that return)
  torch_ag      torch's templated ring, all-gather rotation (xDiT 0.7's default ring_attn)
  torch_a2a     the same with all-to-all rotation
  yunchang_p2p  yunchang ring_flash_attn_func (P2P K/V ring, torch flash kernel; its only CUDA
                kernel with a real lse besides flash-attn)
  ulysses       all-to-all heads<->sequence + one local cuDNN call
Each method's max |err| against the single-GPU output is recorded next to its time, and its
efficiency (single / N over its time) next to that. With --ceiling (on by default) each row also
gets the kernel ceiling of the ring part (benchmarks/ceiling.py: the blocks one ring rank runs,
kernels only, on this GPU) as `ceiling`, and TokenRing's share of it as `token_ring_of_ceiling`;
rank 0 prints each method's efficiency and that share.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import time

import torch
import torch.distributed as dist

from tokenring_xdit.ring.kernels import torch_cudnn
from tokenring_xdit.ring.tensor_layout import BHSD

SHAPES = [("flux", 24, 128, s) for s in (4608, 8192, 16896, 32768, 65536)] + [
    ("pixart", 16, 72, s) for s in (4096, 16384, 65536)
]


def cudnn(q, k, v, dropout_p=0.0, is_causal=False, **_):
    """TokenRing's cuDNN block kernel, in the op signature torch's templated ring calls."""
    assert dropout_p == 0.0 and not is_causal
    return torch_cudnn(q, k, v, q.shape[-1] ** -0.5, BHSD)


def time_ms(fn, iters: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    t = torch.tensor([start.elapsed_time(end) / iters], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # a call is as slow as its slowest rank
    return t.item()


def ring_methods(group):
    """name -> fn(q, k, v) -> out, each a ring over `group` ((b, h, s, d) bf16 inputs)."""
    from torch.distributed.tensor.experimental import _attention as tatt
    from yunchang.kernels import AttnType
    from yunchang.ring.ring_flash_attn import ring_flash_attn_func

    from tokenring_xdit.config import current
    from tokenring_xdit.ring import token_ring_attn

    def torch_ring(rotate):
        def run(q, k, v):
            tatt.set_rotate_method(rotate)
            tatt._cp_options.enable_load_balance = False
            return tatt._templated_ring_attention(group, 1, cudnn, q, k, v)[0]

        return run

    def token_ring(graph, config=None):
        return lambda q, k, v: token_ring_attn(
            q, k, v, group=group, layout="bhsd", kernel="cudnn", cuda_graph=graph, config=config
        )[0]

    def yunchang_p2p(q, k, v):
        qs, ks, vs = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # it wants bshd
        return ring_flash_attn_func(qs, ks, vs, group=group, attn_type=AttnType.TORCH_FLASH)

    return {
        "token_ring": token_ring(True),
        "token_ring_eager": token_ring(False),
        "token_ring_whole_own": token_ring(True, current().replace(defer_own=0.0)),
        "torch_ag": torch_ring("allgather"),
        "torch_a2a": torch_ring("alltoall"),
        "yunchang_p2p": lambda q, k, v: yunchang_p2p(q, k, v).transpose(1, 2),
    }


def heads_to_seq(x: torch.Tensor, group, n: int) -> torch.Tensor:
    """All-to-all: (b, h, s, d) per rank -> (b, h/n, n*s, d), sequence in group-rank order."""
    b, h, s, d = x.shape
    x = x.reshape(b, n, h // n, s, d).permute(1, 0, 2, 3, 4).contiguous()
    y = torch.empty_like(x)
    dist.all_to_all_single(y, x, group=group)
    return y.permute(1, 2, 0, 3, 4).reshape(b, h // n, n * s, d)


def seq_to_heads(o: torch.Tensor, group, n: int) -> torch.Tensor:
    """The inverse all-to-all: (b, h/n, n*s, d) -> (b, h, s, d)."""
    b, hn, ns, d = o.shape
    s = ns // n
    o = o.reshape(b, hn, n, s, d).permute(2, 0, 1, 3, 4).contiguous()
    y = torch.empty_like(o)
    dist.all_to_all_single(y, o, group=group)
    return y.permute(1, 0, 2, 3, 4).reshape(b, hn * n, s, d)


def usp(fn, group, n: int):
    """fn(q, k, v) behind USP's all-to-alls over `group` of size n (no-op for n = 1)."""
    if n == 1:
        return fn
    return lambda q, k, v: seq_to_heads(
        fn(*(heads_to_seq(x, group, n) for x in (q, k, v))), group, n
    )


def _add_ceiling(row: dict, heads: int, d: int, ring: int) -> None:
    """The ring part's kernel ceiling (every rank times it on its own GPU, the same shapes)."""
    from ceiling import ceiling  # benchmarks/ceiling.py (this folder is on sys.path)

    try:
        c = ceiling(row["tokens"], heads, d, ring, kernel="cudnn", iters=5, budget_ms=500.0)
    except (ValueError, RuntimeError) as exc:  # record, keep sweeping (as the methods do)
        row["ceiling_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        return
    row["ceiling"] = c["ceiling"]
    if row.get("token_ring_efficiency"):
        row["token_ring_of_ceiling"] = row["token_ring_efficiency"] / c["ceiling"]


def efficiency_line(row: dict) -> str:
    """`model tokens: method eff ..., TokenRing x of its ceiling c` (single / N over time)."""
    effs = [
        f"{key.removesuffix('_efficiency')} {x:.3f}"
        for key, x in row.items()
        if key.endswith("_efficiency") and x is not None
    ]
    text = f"  {row['model']} {row['tokens']}: efficiency " + ", ".join(effs)
    if row.get("token_ring_of_ceiling") is not None:
        text += (
            f"; TokenRing at {row['token_ring_of_ceiling']:.3f} of its kernel ceiling "
            f"{row['ceiling']:.3f}"
        )
    return text


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=65536)
    ap.add_argument("--ulysses", type=int, default=1, help="ulysses degree U (ring = N / U)")
    ap.add_argument(
        "--ceiling",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time the ring's kernel ceiling per shape (benchmarks/ceiling.py)",
    )
    args = ap.parse_args()

    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    from tokenring_xdit.ring import setup_token_ring_group

    u = args.ulysses
    if u < 1 or n % u:
        raise SystemExit(f"--ulysses {u} must divide the {n} ranks")
    world = dist.new_group(list(range(n)))
    # every new_group call is collective: make all of them on every rank, keep our own
    uly_groups = [dist.new_group(list(range(i * u, (i + 1) * u))) for i in range(n // u)]
    ring_groups = [dist.new_group(list(range(j, n, u))) for j in range(u)]
    uly_group, ring_group = uly_groups[rank // u], ring_groups[rank % u]
    setup_token_ring_group(ring_group)
    rows = []
    for model, heads, d, total in SHAPES:
        if total > args.max_tokens:
            continue
        gen = torch.Generator(device="cuda").manual_seed(0)
        full = [
            torch.randn(1, heads, total, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(3)
        ]
        q, k, v = (x.chunk(n, dim=2)[rank].contiguous() for x in full)
        ref = cudnn(*full)[0].chunk(n, dim=2)[rank]
        row = {
            "model": model,
            "heads": heads,
            "head_size": d,
            "tokens": total,
            "ranks": n,
            "ulysses": u,
            "ring": n // u,
            "single_ms": time_ms(lambda full=full: cudnn(*full), args.iters, args.warmup),
        }
        row["ideal_ms"] = row["single_ms"] / n
        timed = {name: usp(fn, uly_group, u) for name, fn in ring_methods(ring_group).items()}
        if heads % n == 0:
            timed["ulysses"] = usp(lambda q, k, v: cudnn(q, k, v)[0], world, n)
        elif heads % u:
            raise SystemExit(f"--ulysses {u} must divide the {heads} heads")
        for name, method in timed.items():
            fn = functools.partial(method, q, k, v)
            try:
                row[f"{name}_ms"] = time_ms(fn, args.iters, args.warmup)
                row[f"{name}_err"] = (fn().float() - ref.float()).abs().max().item()
                row[f"{name}_efficiency"] = row["ideal_ms"] / row[f"{name}_ms"]
            except Exception as exc:  # record, keep sweeping
                row[f"{name}_ms"] = None
                row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        if args.ceiling and n // u > 1:
            _add_ceiling(row, heads // u, d, n // u)
        if rank == 0:
            print(
                json.dumps({k: round(x, 4) if isinstance(x, float) else x for k, x in row.items()}),
                flush=True,
            )
            print(efficiency_line(row), flush=True)
        rows.append(row)
        del full, q, k, v, ref
        torch.cuda.empty_cache()
    if rank == 0:
        meta = {
            "command": f"torchrun --nproc_per_node={n} benchmarks/ring_sweep.py --ulysses {u}",
            "nccl_p2p_disable": os.environ.get("NCCL_P2P_DISABLE", "0"),
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "host": platform.node(),
            "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
