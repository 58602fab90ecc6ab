"""Does a TokenRing call block the host on the GPU? Per path, after warm-up calls, a few calls
run under `torch.cuda.set_sync_debug_mode("error")`, which raises on every synchronising CUDA
call (a blocking copy, `.item()`, `.tolist()` of a GPU tensor, a stream synchronize).

Why it matters: inside a ring call the stream waits on the ring's transfers; a host
wait there, before the call reaches its deadline's watch, holds the host for as long as a dead
peer stays dead (measured on 2 x H200: the packed path's cu_seqlens copy did so).

    torchrun --nproc-per-node 2 benchmarks/diagnostics/host_sync.py --out host_sync.json

Prints and writes {path: "ok" | the error}; tests/gpu/test_gpu_no_host_sync.py asserts on it.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist

PATHS = ("train_causal", "train_packed", "infer_eager", "infer_graphed")


def _step(path: str, tr, tokens: int):
    """One call of the path on this rank's zigzag shards: () -> None."""
    rank, n = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=dev).manual_seed(0)
    full = [torch.randn(1, tokens, h, 128, device=dev, generator=gen, dtype=torch.bfloat16)
            for h in (16, 4, 4)]  # fmt: skip
    causal = path.startswith("train")
    split = tr.make_split(tokens, n, causal=True)
    q, k, v = (tr.shard(x, None, split=split) if causal else x.chunk(n, 1)[rank] for x in full)
    if path.startswith("train"):
        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
        kw = {"cu_seqlens": [0, tokens // 3, tokens // 2, tokens]} if path == "train_packed" else {}

        def train() -> None:
            out = tr.token_ring_attn_func(q, k, v, causal=True, split=split, **kw)
            out.float().square().mean().backward()

        return train

    def infer() -> None:
        with torch.no_grad():
            tr.token_ring_attn(q, k, v, cuda_graph=path == "infer_graphed")

    return infer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl")
    import tokenring_xdit as tr

    results = {}
    for path in args.paths.split(","):
        step = _step(path, tr, args.tokens)
        for _ in range(args.warmup):
            step()
        torch.cuda.synchronize()
        dist.barrier()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(args.calls):
                step()
            results[path] = "ok"
        except RuntimeError as exc:
            results[path] = str(exc).strip().splitlines()[0][:300]
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
        dist.barrier()
    if dist.get_rank() == 0:
        print(json.dumps(results, indent=1), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(dict(results=results, torch=torch.__version__,
                               gpu=torch.cuda.get_device_name()), f, indent=1)  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
