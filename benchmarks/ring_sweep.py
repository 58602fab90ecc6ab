"""Ring-dimension sweep: TokenRing vs the baselines, one attention call, in one run.

Launch on the GPU machine (ring degree = number of GPUs):
  torchrun --nproc_per_node=2 benchmarks/ring_sweep.py --out $OUT/sweep_nvlink.json
  NCCL_P2P_DISABLE=1 torchrun --nproc_per_node=2 benchmarks/ring_sweep.py \
      --out $OUT/sweep_p2p_off.json
Methods (bf16, (b, h, s, d), non-causal, cuDNN per block where the method takes a kernel):
  single        one GPU, full sequence; ideal = single / N
  token_ring    tokenring_xdit.token_ring_attn (replayed as a CUDA graph, the default)
  token_ring_eager  the same without CUDA graphs
  torch_ag      torch's templated ring, all-gather rotation (xDiT 0.7's default ring_attn)
  torch_a2a     the same with all-to-all rotation
  yunchang_p2p  yunchang ring_flash_attn_func (P2P K/V ring, torch flash kernel; its only CUDA
                kernel with a real lse besides flash-attn)
  ulysses       all-to-all heads<->sequence + one local cuDNN call
Each method's max |err| against the single-GPU output is recorded next to its time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch
import torch.distributed as dist

SHAPES = [("flux", 24, 128, s) for s in (4608, 8192, 16896, 32768, 65536)] + [
    ("pixart", 16, 72, s) for s in (4096, 16384, 65536)
]


def cudnn(q, k, v, dropout_p=0.0, is_causal=False, **_):
    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, dropout_p, is_causal, False
    )[:2]
    return out, lse.reshape(q.shape[0], q.shape[1], -1)[:, :, : q.shape[2]]


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


def methods(group, q, k, v, heads, world_size):
    from torch.distributed.tensor.experimental import _attention as tatt
    from yunchang.kernels import AttnType
    from yunchang.ring.ring_flash_attn import ring_flash_attn_func

    from tokenring_xdit.ring import token_ring_attn

    def torch_ring(rotate):
        def run():
            tatt.set_rotate_method(rotate)
            tatt._cp_options.enable_load_balance = False
            return tatt._templated_ring_attention(group, 1, cudnn, q, k, v)[0]

        return run

    qs, ks, vs = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # yunchang wants bshd
    out = {
        "token_ring": lambda: token_ring_attn(
            q, k, v, group=group, layout="bhsd", kernel="cudnn", cuda_graph=True
        )[0],
        "token_ring_eager": lambda: token_ring_attn(
            q, k, v, group=group, layout="bhsd", kernel="cudnn", cuda_graph=False
        )[0],
        "torch_ag": torch_ring("allgather"),
        "torch_a2a": torch_ring("alltoall"),
        "yunchang_p2p": lambda: ring_flash_attn_func(
            qs, ks, vs, group=group, attn_type=AttnType.TORCH_FLASH
        ).transpose(1, 2),
    }
    if heads % world_size == 0:
        out["ulysses"] = lambda: _ulysses(group, q, k, v, world_size)
    return out


def _ulysses(group, q, k, v, n):
    """xDiT-style ulysses: scatter heads / gather sequence, local attention, and back."""
    b, h, s, d = q.shape

    def to_heads(x):  # (b, h, s, d) -> (b, h/n, n*s, d)
        x = x.reshape(b, n, h // n, s, d).permute(1, 0, 2, 3, 4).contiguous()
        y = torch.empty_like(x)
        dist.all_to_all_single(y, x, group=group)
        return y.permute(1, 2, 0, 3, 4).reshape(b, h // n, n * s, d)

    o = cudnn(*(to_heads(x) for x in (q, k, v)))[0]
    o = o.reshape(b, h // n, n, s, d).permute(2, 0, 1, 3, 4).contiguous()
    y = torch.empty_like(o)
    dist.all_to_all_single(y, o, group=group)
    return y.permute(1, 0, 2, 3, 4).reshape(b, h, s, d)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=65536)
    args = ap.parse_args()

    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    from tokenring_xdit.ring import setup_token_ring_group

    group = dist.new_group(list(range(n)))
    setup_token_ring_group(group)
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
            "ring": n,
            "single_ms": time_ms(lambda full=full: cudnn(*full), args.iters, args.warmup),
        }
        row["ideal_ms"] = row["single_ms"] / n
        for name, fn in methods(group, q, k, v, heads, n).items():
            try:
                row[f"{name}_ms"] = time_ms(fn, args.iters, args.warmup)
                row[f"{name}_err"] = (fn().float() - ref.float()).abs().max().item()
                row[f"{name}_efficiency"] = row["ideal_ms"] / row[f"{name}_ms"]
            except Exception as exc:  # record, keep sweeping
                row[f"{name}_ms"] = None
                row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        if rank == 0:
            print(
                json.dumps({k: round(x, 4) if isinstance(x, float) else x for k, x in row.items()}),
                flush=True,
            )
        rows.append(row)
        del full, q, k, v, ref
        torch.cuda.empty_cache()
    if rank == 0:
        meta = {
            "command": f"torchrun --nproc_per_node={n} benchmarks/ring_sweep.py",
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
