"""packed_varlen.py --real-ring: the packed row through a real ring of N ranks (torchrun).

Every rank builds the same seeded row as the one-GPU mode (q, k, v from one generator on the
device, then dout), cuts it with the public `tokenring_xdit.shard(x, split=split)` (split =
`make_split(T, N, causal=True, cu_seqlens=cu, layout=L)`) and times `token_ring_attn_func(q, k,
v, causal=True, split=split, kernel=K)` forward + backward per layout L and kernel K (--kernel, a comma list,
default auto: the pair `auto` picks; several kernels run side by side in one process, each
entry `L/K`, and record the kernel record that ran, `kernel_used`, and the cost model's
`predicted_ms` for it), next to the dense causal ring on the same row (zigzag shards, no
cu_seqlens, its own auto kernel: the bar the packed call must never be slower than, with its
predicted ms `dense_ring_ms`). Time of an
iteration = the slowest rank's (all_reduce MAX), the median over --iters after --warmup
(ranks_ms: each rank's own median, waits for its peers included). The ideal is each document
alone through SDPA on rank 0, / N. --check: out and gradients of every layout against fp64
per-document attention at --check-tokens (the same generator and seed), max abs error.
--profile N: each packed entry's per-rank profile (_packed_profile.py).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def make_row(total: int, seed: int, device, dtype, heads: tuple[int, int, int]):
    """q, k, v (1, total, h, d) as the one-GPU mode draws them (same generator, same order),
    then dout from the same generator (the one-GPU mode draws it unseeded)."""
    h, hk, d = heads
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(n):
        return torch.randn(1, total, n, d, device=device, generator=gen).to(dtype)

    q, k, v = rand(h), rand(hk), rand(hk)
    return q, k, v, rand(h)


def per_document(cu, q, k, v):
    """Each document alone, causal, through SDPA ((b, s, h, d) in and out; K/V expanded to the
    query heads); cuDNN on CUDA in half precision, torch's choice otherwise."""
    rep = q.shape[2] // k.shape[2]
    qb, kb, vb = (x.transpose(1, 2) for x in (q, k, v))
    if rep > 1:
        kb, vb = (x.repeat_interleave(rep, dim=1) for x in (kb, vb))
    cudnn = q.is_cuda and q.dtype in (torch.bfloat16, torch.float16)
    outs = []
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION) if cudnn else contextlib.nullcontext():
        for a, b in zip(cu, cu[1:], strict=False):
            pieces = (x[:, :, a:b] for x in (qb, kb, vb))
            outs.append(F.scaled_dot_product_attention(*pieces, is_causal=True))
    return torch.cat(outs, dim=2).transpose(1, 2)


def _clock(step, warmup: int, iters: int, device, ring: bool) -> tuple[float, list[float]]:
    """(median ms of `step`, [each rank's own median]) (CUDA events on a GPU, wall clock on
    CPU); ring=True: every rank starts together and an iteration counts the slowest rank's
    time."""
    times = []
    for i in range(warmup + iters):
        if device.type == "cuda":
            torch.cuda.synchronize()
        if ring:
            dist.barrier()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            step()
            ms = (time.perf_counter() - t0) * 1e3
        if i >= warmup:
            times.append(ms)
    own = [statistics.median(times)]
    if not ring:
        return own[0], own
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, own[0])
    t = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return statistics.median(t.tolist()), ranks


def _shards(full, layout: str | None, cu):
    """This rank's leaf shards of `full` tensors and their split: `layout` with cu_seqlens, or
    (None) the dense zigzag without documents."""
    import tokenring_xdit

    kw = {} if layout is None else {"cu_seqlens": cu, "layout": layout}
    split = tokenring_xdit.make_split(full[0].shape[1], dist.get_world_size(), causal=True, **kw)
    shards = [tokenring_xdit.shard(x, split=split).detach().requires_grad_() for x in full]
    return [*shards, split]


def _fwd_bwd(q, k, v, do, split, kernel="auto"):
    from tokenring_xdit import token_ring_attn_func

    for x in (q, k, v):
        x.grad = None
    kw = {} if split.docs is None else {"kernel": kernel}
    out = token_ring_attn_func(q, k, v, causal=True, split=split, **kw)
    out.backward(do)
    return out


def _reference(cu, q, k, v, do) -> list[torch.Tensor]:
    """fp64 out, dq, dk, dv of each document alone, one document and K/V head at a time (the
    memory of one (query heads of a group, L, L) score block at a time)."""
    rep = q.shape[2] // k.shape[2]
    res = [torch.zeros(x.shape, dtype=torch.float64, device=x.device) for x in (q, q, k, v)]
    for a, b in zip(cu, cu[1:], strict=False):
        for j in range(k.shape[2]):
            hq, hk = slice(j * rep, (j + 1) * rep), slice(j, j + 1)
            heads = (hq, hk, hk)
            ins = [
                x[:, a:b, h].double().requires_grad_()
                for x, h in zip((q, k, v), heads, strict=True)
            ]
            out = per_document([0, b - a], *ins)
            out.backward(do[:, a:b, hq].double())
            got = (out.detach(), *(x.grad for x in ins))
            for dst, g, h in zip(res, got, (hq, *heads), strict=True):
                dst[:, a:b, h] = g
    return res


def _check(args, documents, device, dtype, heads, layouts) -> dict:
    """max |error| of out, dq, dk, dv of every layout vs fp64 per-document attention."""
    import tokenring_xdit

    total = args.check_tokens
    cu = documents(total)
    full = make_row(total, args.seed, device, dtype, heads)
    refs = _reference(cu, *full)
    res = {}
    for layout, kernel, name in _methods(layouts, _kernels(args)):
        q, k, v, do, split = _shards(full, layout, cu)
        out = _fwd_bwd(q, k, v, do, split, kernel)
        got = [
            tokenring_xdit.unshard(x.detach(), split=split) for x in (out, q.grad, k.grad, v.grad)
        ]
        errs = {
            name: float((g.double() - r).abs().max())
            for name, g, r in zip(("out", "dq", "dk", "dv"), got, refs, strict=True)
        }
        res[name] = errs
        if dist.get_rank() == 0:
            print(f"  check {total} tokens {name}: max abs {errs}", flush=True)
    return {"tokens": total, "documents": len(cu) - 1, "max_abs": res}


def _row(total, args, documents, device, dtype, heads, layouts) -> dict:
    from tokenring_xdit.ring.packed import document_work

    n, rank = dist.get_world_size(), dist.get_rank()
    cu = documents(total)
    full = make_row(total, args.seed, device, dtype, heads)
    row = {"tokens": total, "documents": len(cu) - 1, "ring": n, "cu_seqlens": cu, "methods": {}}
    ideal = torch.zeros(1, dtype=torch.float64, device=device)
    if rank == 0:
        rep = heads[0] // heads[1]  # K/V expanded outside the clock, as the one-GPU mode does
        ins = [full[0], *(x.repeat_interleave(rep, dim=2) for x in full[1:3])]
        ins = [x.detach().requires_grad_() for x in ins]

        def alone():
            for x in ins:
                x.grad = None
            per_document(cu, *ins).backward(full[3])

        ideal[0] = _clock(alone, args.warmup, args.iters, device, ring=False)[0]
        del ins
    dist.broadcast(ideal, 0)  # the others wait here
    row["per_document"] = float(ideal[0])
    row["ideal_ring"] = row["per_document"] / n
    dense_pairs = total * (total + 1) // 2
    step = functools.partial(_fwd_bwd, *_shards(full, None, cu))  # its own auto kernel
    ms, ranks_ms = _clock(step, args.warmup, args.iters, device, ring=True)
    report = document_work(cu, n, causal=True)
    row["methods"]["dense_causal"] = {
        "ms": ms, "efficiency": row["ideal_ring"] / ms, "ranks_ms": ranks_ms,
        "pairs_total": dense_pairs,  # every rank: about dense_pairs / N
        "predicted_ms": report["dense_ring_ms"],
    }  # fmt: skip
    row["auto"] = {"layout": report["auto"], "kernel": report["auto_kernel"],
                   "choices": report["choices"]}  # fmt: skip
    for layout, kernel, name in _methods(layouts, _kernels(args)):
        step = functools.partial(_fwd_bwd, *_shards(full, layout, cu), kernel)
        ms, ranks_ms = _clock(step, args.warmup, args.iters, device, ring=True)
        report = document_work(cu, n, causal=True, layout=layout)
        used = _kernel_used(kernel, report["layout"], cu, n, device, dtype, heads)
        priced = PRICED.get(used)
        row["methods"][name] = {
            "ms": ms,
            "efficiency": row["ideal_ring"] / ms,
            "ranks_ms": ranks_ms,
            "kernel": kernel,
            "kernel_used": used,
            "layout_used": report["layout"],
            "spread": report["spread"],
            # the cost model's slowest rank with the kernel that ran (None: not priced)
            "predicted_ms": report["kernels"].get(priced) if priced else None,
            "pairs_per_rank": [r["pairs"] for r in report["ranks"]],
            "pairs_vs_dense": report["pairs_total"] / dense_pairs,
            "speedup_vs_dense_ring": row["methods"]["dense_causal"]["ms"] / ms,
        }
        if args.profile:  # each rank's profile of --profile more calls
            from _packed_profile import profile_ranks

            entry, cuda = row["methods"][name], device.type == "cuda"
            entry["profile"] = profile_ranks(
                step, args.profile, ranks_ms, report["ranks"], priced, cuda, args.profile_events
            )
        del step
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


# record name -> the cost table's kernel (kernels.names.PRICED)
PRICED = {"flash_varlen": "flash_varlen", "cudnn+segments": "cudnn"}


def _kernels(args) -> list[str]:
    return [x for x in args.kernel.split(",") if x]


def _methods(layouts, kernels):
    """(layout, kernel, entry name) of every packed run: the layout's name alone with one
    kernel (the files of before), `layout/kernel` with several."""
    for layout in layouts:
        for kernel in kernels:
            yield layout, kernel, layout if len(kernels) == 1 else f"{layout}/{kernel}"


def _kernel_used(kernel, layout, cu, n, device, dtype, heads) -> str:
    """The record a packed call with `kernel` runs here (the product's own choice: the probe
    and, for auto, the cost model's pick for these documents, ring size and layout)."""
    from tokenring_xdit.ring.kernels import doc_pair, select_pair
    from tokenring_xdit.ring.packed import Documents, kernel_order

    d = heads[2]
    args = (device, dtype, d, d)
    order = kernel_order(Documents(tuple(cu)), n, True, layout)
    return doc_pair(kernel, *args, lambda name: select_pair(name, *args, False), order).name


def _table(rows) -> str:
    head = f"{'tokens':>7} {'docs':>4} {'N':>2} {'ideal/N':>8} {'method':>34} {'ms':>9} "
    lines = [head + f"{'eff':>5} {'vs dense':>8} {'model':>7}  pairs per rank"]
    for r in rows:
        for name, e in r["methods"].items():
            pairs = e.get("pairs_per_rank", "")
            shown = name
            if "kernel_used" in e:
                shown = f"{name}:{e['layout_used']}/{e['kernel_used']}"
            vs = f"{e['speedup_vs_dense_ring']:8.2f}" if "speedup_vs_dense_ring" in e else " " * 8
            model = f"{e['predicted_ms']:7.2f}" if e.get("predicted_ms") is not None else " " * 7
            lines.append(
                f"{r['tokens']:>7} {r['documents']:>4} {r['ring']:>2} {r['ideal_ring']:8.2f} "
                f"{shown[-34:]:>34} {e['ms']:9.2f} {e['efficiency']:5.2f} {vs} {model}  {pairs}"
            )
        lines.append(f"  auto picks {r['auto']['layout']}/{r['auto']['kernel']}")
    return "\n".join(lines)


def ring_meta(device, heads) -> dict:
    """The machine and ring a --real-ring result was measured on."""
    return {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "backend": dist.get_backend(),
        "world_size": dist.get_world_size(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "heads": list(heads),
    }


def main_real_ring(args, documents) -> None:
    """The --real-ring mode under torchrun (NCCL on --device cuda, gloo on cpu)."""
    from tokenring_xdit.ring.comm import setup_token_ring_group

    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    setup_token_ring_group(dist.group.WORLD)
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    name = args.dtype if args.dtype != "auto" else ("bfloat16" if cuda else "float32")
    dtype = getattr(torch, name)
    heads = (args.heads, args.kv_heads, args.head_dim)
    layouts = [x for x in args.layout.split(",") if x]
    if args.train_graph:  # packed training with the ring's CUDA graphs (_packed_train_graph.py)
        from _packed_train_graph import main_train_graph

        main_train_graph(args, documents, device, dtype, heads, layouts)
        dist.barrier()
        dist.destroy_process_group()
        return
    rank = dist.get_rank()
    result = {"meta": {}, "rows": []}
    if args.check:
        result["check"] = _check(args, documents, device, dtype, heads, layouts)
    for total in (int(x) for x in args.tokens.split(",") if x):
        if rank == 0:
            print(f"{total} tokens over {dist.get_world_size()} ranks", flush=True)
        result["rows"].append(_row(total, args, documents, device, dtype, heads, layouts))
    result["meta"] = {
        "mode": "real_ring",
        **ring_meta(device, heads),
        "dtype": name,
        "warmup": args.warmup,
        "iters": args.iters,
        "layouts": layouts,
        "kernel": args.kernel,  # a comma list: each packed entry says its own
        "order": args.order,
    }
    if args.profile:  # absent without --profile: the files of before
        result["meta"]["profile_calls"] = args.profile
    if rank == 0:
        print(_table(result["rows"]))
        if args.profile:
            from _packed_profile import profile_table

            print(profile_table(result["rows"]))
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(json.dumps(result["meta"]))
    dist.barrier()
    dist.destroy_process_group()
