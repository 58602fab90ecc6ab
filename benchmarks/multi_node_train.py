"""Training across nodes: forward + backward per attention call, GQA and MHA, TokenRing vs
ulysses vs yunchang's K/V rings, with every method checked against exact attention.

    torchrun --nproc-per-node 2 benchmarks/multi_node_train.py --check --out train.json
    python -m benchmarks multi_node --nodes 2 multi_node_train --check --out train.json

train_sweep.py's timing, exactness check and yunchang wiring, on the shapes an inter-node ring is
for: causal GQA 32 query / 8 K/V heads (Llama-3-8B) and non-causal 32 heads, head size 128
(--shapes "name:heads:kv_heads:head_dim:causal|full,..."). Methods at ring N = all ranks:
  token_ring       tokenring_xdit.token_ring_attn_func (K/V stay home, GQA native), zigzag shards
                   for causal calls; token_ring_hold_back the same with train_hold_back on,
                   token_ring_graph with train_cuda_graph on (forward and backward replayed as
                   CUDA graphs; its --check runs on a replay: a first call on other data
                   captures them) (each only when named in --methods)
  ulysses          all-to-all heads -> sequence (torch.distributed.nn, differentiable), one local
                   SDPA call (cuDNN on a GPU; K/V heads repeated locally under GQA), all-to-all
                   back; contiguous shards (its gathered sequence must be in order)
  yunchang_basic   yunchang's P2P K/V ring; yunchang_zigzag its zigzag ring (causal rows only):
                   the block kernels train_sweep puts behind yunchang.kernels, K/V heads repeated
                   per block under GQA (the ring itself moves the K/V heads it was given)
Every rank also writes which stand-in node it ran on (NCCL_HOSTID) and its ring graph cache's
counts (captures, replays, refusals with their reasons) into the JSON.
--device cpu (gloo): the same wiring on tiny --shapes (the launcher's CPU test).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_sweep as ts  # noqa: E402  (sibling script: its timing, check and yunchang wiring)

DEFAULT_SHAPES = "gqa-32-8:32:8:128:causal,mha-32:32:32:128:full"


def parse_shapes(text: str) -> list[tuple[str, int, int, int, bool]]:
    out = []
    for item in text.split(","):
        name, h, hk, d, kind = item.split(":")
        if kind not in ("causal", "full") or int(h) % int(hk):
            raise SystemExit(f"bad shape {item!r}: name:heads:kv_heads:head_dim:causal|full")
        out.append((name, int(h), int(hk), int(d), kind == "causal"))
    return out


def _heads_to_seq(x: torch.Tensor, n: int) -> torch.Tensor:
    """(b, s, h, d) per rank -> (b, n*s, h/n, d), differentiable."""
    from torch.distributed.nn.functional import all_to_all_single

    b, s, h, d = x.shape
    x = x.reshape(b, s, n, h // n, d).permute(2, 0, 1, 3, 4).contiguous()
    y = all_to_all_single(torch.empty_like(x), x)
    return y.permute(1, 0, 2, 3, 4).reshape(b, n * s, h // n, d)


def _seq_to_heads(x: torch.Tensor, n: int) -> torch.Tensor:
    """The inverse: (b, n*s, h/n, d) -> (b, s, h, d)."""
    from torch.distributed.nn.functional import all_to_all_single

    b, ns, hn, d = x.shape
    x = x.reshape(b, n, ns // n, hn, d).permute(1, 0, 2, 3, 4).contiguous()
    y = all_to_all_single(torch.empty_like(x), x)
    return y.permute(1, 2, 0, 3, 4).reshape(b, ns // n, n * hn, d)


def _local_attention(q, k, v, causal):
    """(b, s, h, d) with K/V heads repeated to q's; cuDNN on a GPU."""
    g = q.shape[2] // k.shape[2]
    k, v = (x.repeat_interleave(g, dim=2) if g > 1 else x for x in (k, v))
    args = [x.transpose(1, 2) for x in (q, k, v)]
    if q.is_cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = torch.nn.functional.scaled_dot_product_attention(*args, is_causal=causal)
    else:
        out = torch.nn.functional.scaled_dot_product_attention(*args, is_causal=causal)
    return out.transpose(1, 2)


def _gqa_yunchang_kernels() -> None:
    """Let the pair behind yunchang.kernels take fewer K/V heads: repeat them per block and sum
    dK/dV back over each group (what flash-attn does inside its kernel)."""
    import yunchang.kernels as yk

    from tokenring_xdit.ring.kernels.wrappers import expand_kv, fold_kv_grad
    from tokenring_xdit.ring.tensor_layout import BSHD

    fwd, bwd = yk.flash_attn_forward, yk.flash_attn_backward

    def forward(q, k, v, *args, **kwargs):
        g = q.shape[2] // k.shape[2]
        return fwd(q, expand_kv(k, g, BSHD), expand_kv(v, g, BSHD), *args, **kwargs)

    def backward(dout, q, k, v, out, lse, dq, dk, dv, *args, **kwargs):
        g = q.shape[2] // k.shape[2]
        if g == 1:
            return bwd(dout, q, k, v, out, lse, dq, dk, dv, *args, **kwargs)
        ke, ve = expand_kv(k, g, BSHD), expand_kv(v, g, BSHD)
        dke, dve = torch.empty_like(ke), torch.empty_like(ve)
        bwd(dout, q, ke, ve, out, lse, dq, dke, dve, *args, **kwargs)
        dk.copy_(fold_kv_grad(dke, g, BSHD, dk.dtype))
        dv.copy_(fold_kv_grad(dve, g, BSHD, dv.dtype))

    yk.flash_attn_forward, yk.flash_attn_backward = forward, backward


# token_ring variants: method -> the RingConfig flag it switches on
VARIANTS = {
    "token_ring_hold_back": "train_hold_back",  # ring/training/hold_back.py
    "token_ring_graph": "train_cuda_graph",  # ring/training/run.py
}


def _with_config(token_ring, cfg, q, k, v, c):
    return token_ring(q, k, v, c, config=cfg)


def methods(n: int, device: str, names: list[str]) -> dict:
    """name -> fn(q, k, v, causal), (b, s_local, h, d) differentiable."""
    from tokenring_xdit.ring import token_ring_attn_func
    from tokenring_xdit.ring.split.sharding import make_split

    def token_ring(q, k, v, c, **options):
        # zigzag shards cut by this script: the split they were cut by
        split = make_split(q.shape[1] * n, n, causal=True) if c else None
        return token_ring_attn_func(q, k, v, causal=c, split=split, **options)

    def ulysses(q, k, v, c):
        parts = (_heads_to_seq(x, n) for x in (q, k, v))
        return _seq_to_heads(_local_attention(*parts, c), n)

    out = {"token_ring": token_ring, "ulysses": ulysses}
    for name, setting in VARIANTS.items():  # token_ring with one RingConfig setting on
        if name in names:
            from tokenring_xdit.config import current

            cfg = current().replace(**{setting: True})
            out[name] = functools.partial(_with_config, token_ring, cfg)
    if any(name.startswith("yunchang") for name in names):
        from yunchang import ring_flash_attn_func, zigzag_ring_flash_attn_func

        ts._yunchang_kernel(device)
        _gqa_yunchang_kernels()
        out["yunchang_basic"] = lambda q, k, v, c: ring_flash_attn_func(q, k, v, causal=c)
        out["yunchang_zigzag"] = lambda q, k, v, c: zigzag_ring_flash_attn_func(q, k, v, causal=c)
    unknown = set(names) - set(out)
    if unknown:
        raise SystemExit(f"unknown methods {sorted(unknown)}; use {', '.join(out)}")
    return {k: out[k] for k in names}


ZIGZAG = ("token_ring", *VARIANTS, "yunchang_zigzag")
GRAPHED = ("token_ring_graph",)  # checked on a replay (_check)


def _shard(name: str, causal: bool, rank: int, n: int):
    zig = causal and name in ZIGZAG
    return lambda x: (ts._zigzag if zig else ts._contiguous)(x, rank, n)


def _check(name: str, fn, shard, problem, causal: bool) -> dict:
    """train_sweep's check of one method; a graphed one's on a replay: a first call on other
    data of the same shapes runs eagerly and captures, so the check sees copied-in inputs."""
    if name in GRAPHED:
        (q, k, v, do), _ = problem
        warm = [torch.randn_like(shard(x)).requires_grad_() for x in (q, k, v)]
        fn(*warm, causal).backward(torch.randn_like(shard(do)))
    return ts._check(fn, shard, problem, causal)


def _graph_stats() -> list[dict]:
    """Every rank's ring graph cache counts (a refused capture leaves its call eager)."""
    from tokenring_xdit.ring.graph_cache import RING_GRAPHS

    stats = RING_GRAPHS.stats
    mine = dict(captures=stats.captures, replays=stats.replays, eager=stats.eager,
                refused=list(stats.refused))  # fmt: skip
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


def _reference(s: int, h: int, hk: int, d: int, causal: bool, device: str):
    """Inputs (q, k, v, dO) in bf16 and the exact fp64 (out, dq, dk, dv) of the whole sequence."""
    gen = torch.Generator(device=device).manual_seed(0)
    shapes = [(1, s, h, d), (1, s, hk, d), (1, s, hk, d), (1, s, h, d)]
    inputs = [torch.randn(sh, device=device, generator=gen).bfloat16() for sh in shapes]
    xs = [x.double().requires_grad_() for x in inputs[:3]]
    g = h // hk
    k, v = (x.repeat_interleave(g, dim=2) for x in xs[1:])
    out = torch.nn.functional.scaled_dot_product_attention(
        *(x.transpose(1, 2) for x in (xs[0], k, v)), is_causal=causal
    ).transpose(1, 2)
    out.backward(inputs[3].double())
    return inputs, [out.detach(), *(x.grad for x in xs)]


def _node_ids(device: str) -> list[str]:
    ids = [None] * dist.get_world_size()
    dist.all_gather_object(ids, os.environ.get("NCCL_HOSTID", platform.node()))
    return ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--seqs", default="16384,32768,65536", help="global sequence lengths")
    ap.add_argument("--methods", default="token_ring,ulysses,yunchang_basic,yunchang_zigzag")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--check", action="store_true", help="every method vs exact fp64 first")
    ap.add_argument("--check-tokens", type=int, default=1024, help="--check tokens per rank")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", default="multi_node_train.json")
    args = ap.parse_args()

    import tokenring_xdit
    from tokenring_xdit.ring.comm import setup_token_ring_group
    from tokenring_xdit.ring.graph_cache import clear_graphs

    tokenring_xdit.install()
    device = args.device
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    setup_token_ring_group(dist.group.WORLD)
    impls = methods(n, device, args.methods.split(","))
    nodes = _node_ids(device)
    rows, checks = [], {}
    for shape, h, hk, d, causal in parse_shapes(args.shapes):
        names = [m for m in impls if causal or m != "yunchang_zigzag"]  # zigzag: causal only
        if args.check:
            problem = _reference(args.check_tokens * n, h, hk, d, causal, device)
            for name in names:
                try:
                    errs = _check(name, impls[name], _shard(name, causal, rank, n), problem, causal)
                except Exception as e:  # a baseline that cannot run it; TokenRing must
                    if name == "token_ring" or name in VARIANTS:
                        raise
                    errs = dict(error=f"{type(e).__name__}: {str(e)[:200]}")
                checks[f"{shape}/{name}"] = errs
            del problem
        for seq in map(int, args.seqs.split(",")):
            gen = torch.Generator(device=device).manual_seed(rank)
            heads = (h, hk, hk, h)
            q, k, v, do = (
                torch.randn(1, seq // n, hh, d, device=device, generator=gen)
                .bfloat16()
                .requires_grad_(i < 3)
                for i, hh in enumerate(heads)
            )
            for name in names:
                try:
                    row = dict(impl=name, ms=ts._time(impls[name], q, k, v, do, causal,
                                                      args.warmup, args.iters))  # fmt: skip
                except Exception as e:  # a baseline that cannot run this config
                    row = dict(impl=name, error=f"{type(e).__name__}: {str(e)[:200]}")
                rows.append(dict(shape=shape, heads=h, kv_heads=hk, head_dim=d, seq=seq,
                                 causal=causal, world=n, ring=n, ulysses=1, **row))  # fmt: skip
                if rank == 0:
                    print(rows[-1], flush=True)
            del q, k, v, do
            if device == "cuda":
                clear_graphs()  # a shape's graphs (their pools) go with it
                torch.cuda.empty_cache()
    graph_stats = _graph_stats()
    if rank == 0:
        result = dict(
            meta=dict(
                machine=platform.node(),
                gpu=torch.cuda.get_device_name() if device == "cuda" else "cpu",
                torch=torch.__version__,
                world=n,
                node_of_rank=nodes,
                yunchang_kernel=ts.YUNCHANG_KERNEL,
                command=" ".join(sys.argv),
                graph_stats=graph_stats,
            ),
            checks=checks,
            rows=rows,
        )
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print("checks:", json.dumps(checks, indent=1), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
