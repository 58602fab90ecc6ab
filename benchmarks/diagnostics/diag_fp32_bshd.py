"""Diagnostic for the fp32 (b, s, h, d) CUDA discrepancy first seen on 2 x H200 (since fixed).

  [DIAG_ADMIT_FP32=0] torchrun --nproc_per_node=N benchmarks/diagnostics/diag_fp32_bshd.py
Prints TokenRing's max |err| vs fp64 exact attention per rank for fused merge on/off, CUDA graph
on/off, both layouts, fp32 and bf16, uneven local lengths. On 2xH200 (2026-11-22) rank 1 showed
2.8e-2..3.8e-2 for fp32 bshd wherever the Triton merge ran; every other line was <= 1.5e-3
(bf16) / 1.5e-6 (fp32). Cause, found on 4xH200: a race in the Triton merge when
lse_out aliases lse_a (fixed by a CTA barrier; see fused_merge.py). Graphed lines report a replay
(before the fix they reported the eager warm-up call). DIAG_ADMIT_FP32=0 keeps fp32 partials off
the Triton merge, as the code had it before the fix.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from tokenring_xdit.ring import setup_token_ring_group, token_ring_attn
from tokenring_xdit.ring.merge import fused as fused_merge
from tokenring_xdit.ring.kernels import math
from tokenring_xdit.ring.tensor_layout import get_layout


def _case(rank, n, layout, dtype, graph):
    lay = get_layout(layout)
    gen = torch.Generator(device="cuda").manual_seed(7)
    lens, kv_lens, h, d = (
        [1000 + 24 * r for r in range(n)],
        [1500 + 8 * r for r in range(n)],
        16,
        72,
    )

    def make(m):
        shape = (2, m, h, d) if layout == "bshd" else (2, h, m, d)
        return torch.randn(shape, device="cuda", dtype=dtype, generator=gen)

    q, k, v = make(sum(lens)), make(sum(kv_lens)), make(sum(kv_lens))
    sd = lay.seq_dim
    ql, kl, vl = (x.split(ls, dim=sd)[rank] for x, ls in ((q, lens), (k, kv_lens), (v, kv_lens)))
    with torch.no_grad():
        for _ in range(2 if graph else 1):  # a graphed key's first call is its eager warm-up
            out, _ = token_ring_attn(ql, kl, vl, layout=layout, cuda_graph=graph)
    ref, _ = math(q.double(), k.double(), v.double(), d**-0.5, lay)
    return (out.double() - ref.split(lens, dim=sd)[rank]).abs().max().item()


def main() -> None:
    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    setup_token_ring_group(dist.group.WORLD)
    admit_fp32 = os.environ.get("DIAG_ADMIT_FP32", "1") == "1"
    if not admit_fp32:  # keep fp32 partials off the Triton merge (as before the fix)
        fused_merge.SERVED_DTYPES = tuple(
            t for t in fused_merge.SERVED_DTYPES if t != torch.float32
        )
    for fused in ("1", "0"):
        os.environ["TOKENRING_XDIT_FUSED_MERGE"] = fused
        for graph in (False, True):
            for layout in ("bshd", "bhsd"):
                for dtype in (torch.float32, torch.bfloat16):
                    err = _case(rank, n, layout, dtype, graph)
                    print(
                        f"rank{rank} fused={fused} admit_fp32={int(admit_fp32)} graph={graph} "
                        f"{layout} {dtype} err={err:.2e}",
                        flush=True,
                    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
