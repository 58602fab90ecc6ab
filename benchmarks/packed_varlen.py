"""Packed documents on one GPU: which kernel for the ring's blocks, and what a ring rank costs.

    python benchmarks/packed_varlen.py --out packed_varlen.json
    python benchmarks/packed_varlen.py --tokens 32768,131072 --rings 2,4,8 --iters 5

A packed sequence of --tokens tokens made of documents of 512-8192 tokens (seeded, the last one
cut to fit), Llama-3-8B attention (32 query heads, 8 K/V heads, head size 128), bf16, batch 1.
Every number is forward + backward (CUDA events, median of --iters after --warmup):

- per_document: each document alone through SDPA cuDNN, causal (the ideal: exactly the
  documents' work, no mask); ideal_ring_N = per_document / N;
- padded: the documents padded to the longest into a batch, SDPA cuDNN causal;
- dense_causal: the whole packed sequence as ONE causal sequence (no documents: what an
  unmasked causal call costs; wrong for packed data);
- dense_masked: SDPA (efficient kernel) with the (S, S) document mask (only up to 32k tokens);
- flex: FlexAttention with a document-causal block mask (compiled; skipped if unavailable);
- ring1_<pair>: `token_ring_attn_func(..., causal=True, cu_seqlens=...)` at ring degree 1, with
  the document pairs (`flash_varlen`: torch's flash kernel with cu_seqlens; `cudnn+segments`:
  cuDNN once per document);
- replay_N_<pair>: every rank of a ring of N replayed on this GPU with the real loops and local
  lanes (benchmarks/replay_rank.py: compute only, no transfers): max and mean over ranks, and
  max / ideal_ring_N; plus the plan's per-rank attended pairs (`document_work`), for each
  --layout (the row's zigzag, the documents layout, or what `auto` picks).

The real ring (--real-ring, under torchrun; benchmarks/_packed_ring.py), with transfers:

    torchrun --nproc_per_node=N benchmarks/packed_varlen.py --real-ring \
        --tokens 32768,131072 --layout zigzag,documents,auto --check --out packed_ring.json

every rank builds the same seeded row, cuts it with `tokenring_xdit.shard(x, causal=True,
cu_seqlens=cu, layout=L)` and times `token_ring_attn_func(q, k, v, causal=True, cu_seqlens=cu)`
forward + backward per layout, and the dense causal ring on the same row (zigzag shards, no
cu_seqlens): the slowest rank's ms, efficiency = (per_document / N) / ms, the speedup over the
dense ring and each rank's attended pairs (`document_work`). --check: out and gradients of every
layout vs fp64 per-document attention at --check-tokens (max abs error). --device cpu runs it
on gloo at a tiny size (e.g. --tokens 256 --heads 4 --kv-heads 2 --head-dim 16
--doc-lens 16,96). --kernel names the packed calls' kernels (a comma list, each run beside the
others: e.g. auto,flash_varlen,cudnn; default auto, the (layout, kernel) cost model's pick);
--order balanced packs the drawn documents in `tokenring_xdit.ring.packed.pack_order.balanced_order`
for the ring's size (the row's zigzag evened by the packing order alone); balanced-contiguous
in the order that evens the contiguous layout's shards.
--profile N adds to every packed entry a `profile`, one dict per rank, of N more calls under
torch.profiler (benchmarks/_packed_profile.py: timeline, host issue time, launches per call, the
cost model's per-rank ms beside the measured attention busy time, the rank's planned work) and
prints a per-rank table; --profile-events adds every GPU activity of one call per rank.
--train-graph times packed training with the ring's CUDA graphs as a model runs it: per step a
new packing through --layers calls forward + backward, graphs on vs eager on the same packings
(benchmarks/_packed_train_graph.py; --check then compares every replayed call with the eager
one and both with fp64):

    torchrun --nproc_per_node=4 benchmarks/packed_varlen.py --real-ring --train-graph \
        --layers 8 --steps 4 --tokens 32768,131072 --check --out packed_train_graph.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from replay_rank import _timed  # noqa: E402

from tests.local_ring import LocalRing  # noqa: E402

H, HK, D = 32, 8, 128


def _documents(total: int, seed: int, lo: int = 512, hi: int = 8192) -> list[int]:
    rng, cu = random.Random(seed), [0]
    while cu[-1] < total:
        cu.append(min(total, cu[-1] + rng.randint(lo, hi)))
    return cu


def _ordered(cu: list[int], args) -> list[int]:
    """cu with its documents in balanced_order for the ring's size (--order balanced; every
    rank computes the same order from the same lengths)."""
    if args.order == "packed":
        return cu
    import torch.distributed as dist

    from tokenring_xdit.ring.packed.pack_order import balanced_order

    lengths = [b - a for a, b in zip(cu, cu[1:], strict=False)]
    # judged by the kernel the run names, if exactly one priced kernel; else auto's (cuDNN)
    named = args.kernel.split(",")
    kernel = named[0] if len(named) == 1 and named[0] in ("flash_varlen", "cudnn") else "cudnn"
    split = "contiguous" if args.order == "balanced-contiguous" else "zigzag"
    order = balanced_order(lengths, dist.get_world_size(), kernel=kernel, split=split)
    out = [0]
    for i in order:
        out.append(out[-1] + lengths[i])
    return out


def _grad_fn(f, ins, do):
    def run():
        for x in ins:
            x.grad = None
        f().backward(do)

    return run


def _single_gpu(cu, q, k, v, do, args) -> dict:
    """(b, s, h, d) inputs; K/V with HK heads. Baselines get K/V expanded to H heads."""
    from tokenring_xdit import token_ring_attn_func

    total, res = cu[-1], {}
    ke, ve = (x.detach().repeat_interleave(H // HK, dim=2).requires_grad_() for x in (k, v))
    qb, keb, veb, dob = (x.transpose(1, 2) for x in (q, ke, ve, do))
    lens = [b - a for a, b in zip(cu, cu[1:], strict=False)]

    def sdpa(qq, kk, vv, causal=True, mask=None, backend=SDPBackend.CUDNN_ATTENTION):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, is_causal=causal)

    def per_doc():
        spans = zip(cu, cu[1:], strict=False)
        outs = [sdpa(*(x[:, :, a:b] for x in (qb, keb, veb))) for a, b in spans]
        return torch.cat(outs, dim=2)

    def timed(name, f, ins, grad):
        try:
            res[name] = _timed(_grad_fn(f, ins, grad), args.warmup, args.iters)
        except (RuntimeError, NotImplementedError, ValueError) as exc:
            res[name] = f"failed: {str(exc).splitlines()[0][:160]}"
        print(f"  {name}: {res[name]}", flush=True)

    timed("per_document", per_doc, (q, ke, ve), dob)
    timed("dense_causal", lambda: sdpa(qb, keb, veb), (q, ke, ve), dob)
    longest = max(lens)
    pad = [torch.zeros(len(lens), H, longest, D, device="cuda", dtype=q.dtype) for _ in "qkvo"]
    for i, (a, b) in enumerate(zip(cu, cu[1:], strict=False)):
        for p, x in zip(pad, (qb, keb, veb, dob), strict=True):
            p[i, :, : b - a] = x[0, :, a:b].detach()
    pq, pk, pv = (x.requires_grad_() for x in pad[:3])
    timed("padded", lambda: sdpa(pq, pk, pv), (pq, pk, pv), pad[3])
    doc = torch.repeat_interleave(torch.arange(len(lens), device="cuda"), torch.tensor(lens).cuda())
    if total <= 32768:
        mask = (doc[:, None] == doc[None, :]) & torch.ones(
            total, total, dtype=torch.bool, device="cuda"
        ).tril()
        timed(
            "dense_masked",
            lambda: sdpa(qb, keb, veb, False, mask, SDPBackend.EFFICIENT_ATTENTION),
            (q, ke, ve),
            dob,
        )
        del mask
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def doc_causal(b, h, qi, ki):
            return (doc[qi] == doc[ki]) & (ki <= qi)

        block = create_block_mask(doc_causal, None, None, total, total, device="cuda")
        flex = torch.compile(flex_attention)
        timed("flex", lambda: flex(qb, keb, veb, block_mask=block), (q, ke, ve), dob)
    except Exception as exc:  # optional: no flex / no compiler here
        res["flex"] = f"skipped: {str(exc).splitlines()[0][:160]}"
    cu_t = torch.tensor(cu, dtype=torch.int32)
    for kernel in ("auto", "cudnn"):
        name = f"ring1_{'flash_varlen' if kernel == 'auto' else 'cudnn+segments'}"
        timed(
            name,
            lambda kernel=kernel: token_ring_attn_func(
                q, k, v, causal=True, cu_seqlens=cu_t, kernel=kernel
            ),
            (q, k, v),
            do,
        )
    return res


def _replays(cu, q, k, v, do, rings, args) -> dict:
    res = {}
    for layout in args.layout.split(","):
        res.update(_replays_of(layout, cu, q, k, v, do, rings, args))
    return res


def _replays_of(layout, cu, q, k, v, do, rings, args) -> dict:
    """The work report and the replayed ranks of one layout ("zigzag": keys work_N and
    replay_N_<pair> as before; "documents" / "contiguous" / "auto": work_N_<layout>,
    replay_N_<layout>_<pair>,
    where auto runs the layout `shard(..., layout="auto")` picks)."""
    from tokenring_xdit.ring.training.backward import block_backward
    from tokenring_xdit.ring.training.forward import BlockCall, block_forward
    from tokenring_xdit.ring.packed import Documents, doc_plan, document_work
    from tokenring_xdit.ring.kernels import doc_pair, gqa_pair, select_pair
    from tokenring_xdit.ring.tensor_layout import BSHD
    from tokenring_xdit.ring.schedules import block_schedule

    dev, dtype, total = q.device, q.dtype, cu[-1]
    pa = (dev, dtype, D, D)
    res = {}
    for n in rings:
        if total % (2 * n):
            continue
        report = document_work(cu, n, causal=True, layout=layout)
        tag = "" if layout == "zigzag" else f"_{layout}"
        res[f"work_{n}{tag}"] = {
            "layout": report["layout"],
            "spread": report["spread"],
            "predicted_ms": [r["predicted_ms"] for r in report["ranks"]],  # its best kernel
            "kernel": report["kernel"],
            "predicted_ms_by_kernel": {
                k: [r["predicted_ms_by_kernel"][k] for r in report["ranks"]]
                for k in report["kernels"]
            },
            "pairs_per_rank": [r["pairs"] for r in report["ranks"]],
            "kernel_calls": [r["kernel_calls"] for r in report["ranks"]],
            "q_transfers": [r["q_transfers"] for r in report["ranks"]],
            "pairs_vs_dense": report["pairs_total"] / report["dense_pairs"],
        }
        print(f"  work N={n} {layout}: {res[f'work_{n}{tag}']}", flush=True)
        q_lens = (total // n,) * n
        schedule = block_schedule(True, report["layout"])
        plan = doc_plan(Documents(tuple(cu)), schedule, q_lens, report["layout"])
        for kernel in ("flash_varlen", "cudnn"):
            pair = gqa_pair(doc_pair(kernel, *pa, lambda nm: select_pair(nm, *pa, False)), *pa)
            call = BlockCall(schedule, pair, BSHD, D**-0.5, plan)
            per_rank = []
            for r in range(n):
                sl = slice(r * q_lens[r], (r + 1) * q_lens[r])  # any T tokens: timing only
                ql, kl, vl, dol = (x.detach()[:, sl].contiguous() for x in (q, k, v, do))
                ring = LocalRing(r, n)

                def run(ring=ring, ql=ql, kl=kl, vl=vl, dol=dol, call=call, q_lens=q_lens):
                    out, lse = block_forward(call, ring, q_lens, ql, kl, vl)
                    block_backward(call, ring, q_lens, dol, ql, kl, vl, out, lse)

                per_rank.append(_timed(run, args.warmup, args.iters))
            res[f"replay_{n}{tag}_{pair.name}"] = {"max_ms": max(per_rank), "ranks_ms": per_rank}
            print(f"  replay N={n} {layout} {pair.name}: {per_rank}", flush=True)
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="32768,131072")
    parser.add_argument("--rings", default="2,4,8")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--layout",
        default="zigzag,documents",
        help="comma-separated layouts of the replayed rings: zigzag (the row's), documents "
        "(every document in 2N pieces), contiguous (N contiguous shards, --real-ring), auto "
        "(what shard(..., layout='auto') picks)",
    )
    parser.add_argument("--out", default="packed_varlen.json")
    parser.add_argument("--doc-lens", default="512,8192", help="min,max document length")
    ring = parser.add_argument_group("--real-ring (under torchrun)")
    ring.add_argument("--real-ring", action="store_true", help="time the real ring of N ranks")
    ring.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: gloo")
    ring.add_argument("--heads", type=int, default=H)
    ring.add_argument("--kv-heads", type=int, default=HK)
    ring.add_argument("--head-dim", type=int, default=D)
    ring.add_argument("--dtype", default="auto", help="auto: bfloat16 on cuda, float32 on cpu")
    ring.add_argument("--check", action="store_true", help="errors vs fp64 per document")
    ring.add_argument(
        "--order",
        choices=("packed", "balanced", "balanced-contiguous"),
        default="packed",
        help="balanced: pack the drawn documents in tokenring_xdit.ring.packed.pack_order's "
        "balanced_order for the ring's size (the row's zigzag evened by the packing order); "
        "balanced-contiguous: the order that evens the contiguous layout's shards",
    )
    ring.add_argument(
        "--kernel",
        default="auto",
        help="the packed calls' kernels, a comma list run side by side (token_ring_attn_func's "
        "kernel=): auto (the cost model's pick on CUDA half: flash_varlen or cuDNN per segment), "
        "cudnn (cuDNN per segment), flash_varlen, masked, ...",
    )
    ring.add_argument("--check-tokens", type=int, default=16384, help="the --check row")
    ring.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="also profile N calls of every packed entry, per rank (_packed_profile.py: "
        "timeline, host issue time, launches, the model's per-rank ms)",
    )
    ring.add_argument(
        "--profile-events",
        action="store_true",
        help="with --profile: every GPU activity of one more call, per rank (`events`)",
    )
    ring.add_argument(
        "--train-graph",
        action="store_true",
        help="packed training with the ring's CUDA graphs: per step a new packing through "
        "--layers calls forward + backward, graphs on vs eager on the same packings "
        "(_packed_train_graph.py; on the CPU graphs run eagerly and the meta says so)",
    )
    ring.add_argument("--layers", type=int, default=8, help="--train-graph: calls per packing")
    ring.add_argument("--steps", type=int, default=4, help="--train-graph: packings timed")
    args = parser.parse_args()
    if args.profile_events and not args.profile:
        parser.error("--profile-events needs --profile N")
    if args.train_graph and args.profile:
        parser.error("--profile does not combine with --train-graph")
    if min(args.layers, args.steps) < 1:
        parser.error("--layers and --steps must be >= 1")
    lo, hi = (int(x) for x in args.doc_lens.split(","))
    if args.real_ring:
        from _packed_ring import main_real_ring

        # a step's packing: fresh lengths from the same distribution (--train-graph); step 0 is
        # the row of before
        def documents(total: int, step: int = 0) -> list[int]:
            return _ordered(_documents(total, args.seed + step, lo, hi), args)

        main_real_ring(args, documents)
        return
    ring_only = (
        args.device, args.heads, args.kv_heads, args.head_dim, args.dtype, args.check,
        args.kernel, args.order, args.profile, args.profile_events, args.train_graph,
    )  # fmt: skip
    if ring_only != ("cuda", H, HK, D, "auto", False, "auto", "packed", 0, False, False):
        parser.error(
            "--device/--heads/--kv-heads/--head-dim/--dtype/--check/--kernel/--order/--profile"
            "[-events]/--train-graph need --real-ring"
        )
    rings = [int(x) for x in args.rings.split(",") if x]
    rows = []
    for total in (int(x) for x in args.tokens.split(",")):
        cu = _documents(total, args.seed, lo, hi)
        print(f"{total} tokens, {len(cu) - 1} documents", flush=True)
        gen = torch.Generator(device="cuda").manual_seed(args.seed)

        def rand(heads, total=total, gen=gen):
            x = torch.randn(1, total, heads, D, device="cuda", generator=gen)
            return x.bfloat16().requires_grad_()

        q, k, v = rand(H), rand(HK), rand(HK)
        do = torch.randn_like(q).detach()
        row = {"tokens": total, "documents": len(cu) - 1, "cu_seqlens": cu}
        row.update(_single_gpu(cu, q, k, v, do, args))
        if isinstance(row.get("per_document"), float):
            for n in rings:
                row[f"ideal_ring_{n}"] = row["per_document"] / n
        row.update(_replays(cu, q, k, v, do, rings, args))
        for key, val in list(row.items()):
            if key.startswith("replay_") and isinstance(
                row.get(f"ideal_ring_{key.split('_')[1]}"), float
            ):
                val["max_over_ideal"] = val["max_ms"] / row[f"ideal_ring_{key.split('_')[1]}"]
        rows.append(row)
        del q, k, v, do
        torch.cuda.empty_cache()
    meta = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "heads": [H, HK, D],
        "dtype": "bfloat16",
    }
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
