"""Forward + backward time per attention call: TokenRing vs yunchang's rings vs torch's templated
ring vs ulysses, causal and non-causal, on any number of GPUs (also the GPU check script).

    torchrun --nproc-per-node 8 benchmarks/train_sweep.py --out train_sweep.json
    torchrun --nproc-per-node 1 benchmarks/train_sweep.py --check     # ring degree 1 + checks

Shapes are Llama-style (head size 128; 32 heads = Llama-2/3 7-8B, 64 = 70B without GQA).
Every rank holds the zigzag shard (chunks r and 2N-1-r) for causal calls and a contiguous shard
otherwise. Warm-up excluded, CUDA events, median of --iters. With --check every TokenRing
configuration is first compared (out and dq/dk/dv) with exact attention of the whole sequence.
Results: JSON (machine, versions, per-config ms); a --nproc-per-node 1 run gives the single-GPU
time that the fraction of ideal (t_1 / (N t_N)) is computed from.

Baselines: yunchang's basic and zigzag rings (zigzag is causal-only: its non-causal rows run the
basic ring) with flash-attn, or without it TokenRing's cuDNN pair behind yunchang's FA kernel
functions (`yunchang_kernel` in the JSON says which); torch's templated ring with its flash and
its cuDNN ops (head-tail load balancing for causal calls only, as torch requires); ulysses
(yunchang's LongContextAttention, FA kernels as above).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics

import torch
import torch.distributed as dist

SHAPES = {"llama-8b-heads": (32, 128), "llama-70b-heads": (64, 128)}


def _zigzag(x, rank, n, dim=1):
    chunks = x.chunk(2 * n, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * n - 1 - rank]], dim=dim).contiguous()


def _contiguous(x, rank, n, dim=1):
    return x.chunk(n, dim=dim)[rank].contiguous()


def _impls(n: int):
    """name -> fn(q, k, v, causal) with q/k/v (b, s_local, h, d), differentiable."""
    from yunchang import ring_flash_attn_func, zigzag_ring_flash_attn_func

    from tokenring_xdit.ring import token_ring_attn_func
    from tokenring_xdit.ring.sharding import declare_zigzag

    def token_ring(q, k, v, c):
        if c:  # this script cuts zigzag shards itself: declare them, as tokenring_xdit.shard does
            declare_zigzag(None, q.shape[1] * n)
        return token_ring_attn_func(q, k, v, causal=c)

    impls = {"token_ring": token_ring}
    _yunchang_kernel()

    def yunchang_zigzag(q, k, v, c):
        if not c:  # yunchang's zigzag ring is causal-only: its non-causal ring is the basic one
            return ring_flash_attn_func(q, k, v, causal=c)
        return zigzag_ring_flash_attn_func(q, k, v, causal=c)

    impls["yunchang_zigzag"] = yunchang_zigzag
    impls["yunchang_basic"] = lambda q, k, v, c: ring_flash_attn_func(q, k, v, causal=c)
    impls["torch_templated_ring"] = _torch_ring(n, "flash")
    impls["torch_templated_ring_cudnn"] = _torch_ring(n, "cudnn")
    impls["ulysses"] = _ulysses(n)
    return impls


YUNCHANG_KERNEL = "flash_attn"


def _yunchang_kernel() -> None:
    """yunchang's rings take their block kernels from yunchang.kernels (flash-attn for AttnType.FA,
    the only type with a backward there). Without flash-attn they get TokenRing's cuDNN pair
    behind the same two functions, so their schedule and communication can still be measured
    (the pair's output is written into yunchang's buffers: one copy per block more than FA)."""
    global YUNCHANG_KERNEL
    if importlib.util.find_spec("flash_attn") is not None:
        return
    import yunchang.kernels as yk

    from tokenring_xdit.ring.backward_kernels import PAIRS
    from tokenring_xdit.ring.layout import BSHD

    pair = PAIRS["cudnn"]
    YUNCHANG_KERNEL = "cudnn (TokenRing's pair in yunchang.kernels.flash_attn_forward/_backward)"

    def forward(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, *args, **kwargs):
        scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
        return pair.forward(q, k, v, scale, BSHD, causal)

    def backward(dout, q, k, v, out, lse, dq, dk, dv, dropout_p, softmax_scale, causal, *rest,
                 **kwargs):  # fmt: skip
        scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
        grads = pair.backward(dout, q, k, v, out, lse, None, scale, BSHD, causal)
        for buf, g in zip((dq, dk, dv), grads, strict=True):
            buf.copy_(g)

    yk.flash_attn_forward, yk.flash_attn_backward = forward, backward


def _torch_ring(n, kind):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp

    mesh = init_device_mesh("cuda", (n,))
    fwd = getattr(cp, f"_scaled_dot_product_ring_{kind}_attention")
    bwd = getattr(cp, f"_scaled_dot_product_ring_{kind}_attention_backward")

    class Ring(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal):
            res = fwd(mesh, q, k, v, is_causal=causal)
            ctx.save_for_backward(q, k, v, res[0], res[1])
            ctx.rest, ctx.causal = res[2:], causal
            return res[0]

        @staticmethod
        def backward(ctx, dout):
            q, k, v, out, lse = ctx.saved_tensors
            cum_q, cum_k, max_q, max_k, seed, offset = ctx.rest[:6]
            if kind == "flash":
                grads = bwd(
                    mesh, dout, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, ctx.causal,
                    seed, offset, scale=None,
                )  # fmt: skip
            else:
                grads = bwd(
                    mesh, dout, q, k, v, out, lse, seed, offset, None, cum_q, cum_k, max_q,
                    max_k, 0.0, ctx.causal, scale=None,
                )  # fmt: skip
            return (*grads[:3], None)

    def run(q, k, v, causal):  # torch's op is (b, h, s, d)
        # head-tail load balancing = our zigzag shards, causal only; non-causal shards are
        # contiguous and torch refuses load balancing for them
        cp._cp_options.enable_load_balance = causal
        out = Ring.apply(*(x.transpose(1, 2) for x in (q, k, v)), causal)
        return out.transpose(1, 2)

    return run


def _ulysses(n):
    from yunchang import LongContextAttention, set_seq_parallel_pg
    from yunchang.kernels import AttnType

    set_seq_parallel_pg(n, 1, dist.get_rank(), n)
    # AttnType.FA: the ring kernel with a backward (flash-attn, or the cuDNN pair above)
    layer = LongContextAttention(ring_impl_type="basic", attn_type=AttnType.FA)
    return lambda q, k, v, c: layer(q, k, v, causal=c)


def _time(fn, q, k, v, do, causal, warmup, iters) -> float:
    for _ in range(warmup):
        fn(q, k, v, causal).backward(do)
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        start.record()
        fn(q, k, v, causal).backward(do)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _check(fn, b, s, h, d, causal, rank, n) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (
        torch.randn(b, s, h, d, device="cuda", generator=gen).bfloat16() for _ in range(4)
    )
    ref_in = [x.double().requires_grad_() for x in (q, k, v)]
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(x.transpose(1, 2) for x in ref_in), is_causal=causal
    ).transpose(1, 2)
    ref.backward(do.double())
    shard = _zigzag if causal else _contiguous
    loc = [shard(x, rank, n).requires_grad_() for x in (q, k, v)]
    out = fn(*loc, causal)
    out.backward(shard(do, rank, n))
    errs = {"out": (out.double() - shard(ref.detach(), rank, n)).abs().max().item()}
    for name, x, r in zip(("dq", "dk", "dv"), loc, ref_in, strict=True):
        ref_g = shard(r.grad, rank, n)
        errs[name] = ((x.grad.double() - ref_g).abs().max() / ref_g.abs().max()).item()
    return errs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", default="8192,32768", help="global sequence lengths")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--out", default="train_sweep.json")
    args = parser.parse_args()

    import tokenring_xdit
    from tokenring_xdit.ring.comm import setup_token_ring_group

    tokenring_xdit.install()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    setup_token_ring_group(dist.group.WORLD)
    impls = _impls(n)
    rows, checks = [], {}
    for shape, (h, d) in SHAPES.items():
        for causal in (True, False):
            if args.check:
                key = f"{shape}/{'causal' if causal else 'full'}"
                checks[key] = _check(impls["token_ring"], 2, 1024 * n, h, d, causal, rank, n)
            for seq in map(int, args.seqs.split(",")):
                s_local = seq // n
                gen = torch.Generator(device="cuda").manual_seed(rank)
                q, k, v, do = (
                    torch.randn(args.batch, s_local, h, d, device="cuda", generator=gen)
                    .bfloat16()
                    .requires_grad_(i < 3)
                    for i in range(4)
                )
                for name, fn in impls.items():
                    try:
                        ms = _time(fn, q, k, v, do, causal, args.warmup, args.iters)
                        row = dict(impl=name, ms=ms)
                    except Exception as e:  # a baseline that cannot run this config
                        row = dict(impl=name, error=f"{type(e).__name__}: {str(e)[:200]}")
                    rows.append(dict(shape=shape, heads=h, head_dim=d, seq=seq, causal=causal,
                                     world=n, **row))  # fmt: skip
                    if rank == 0:
                        print(rows[-1], flush=True)
    if rank == 0:
        result = dict(
            machine=platform.node(),
            gpu=torch.cuda.get_device_name(),
            torch=torch.__version__,
            world=n,
            yunchang_kernel=YUNCHANG_KERNEL,
            checks=checks,
            rows=rows,
        )
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print("checks:", json.dumps(checks, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
