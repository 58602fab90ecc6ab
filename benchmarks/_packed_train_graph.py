"""packed_varlen.py --real-ring --train-graph: packed training with the ring's CUDA graphs, as
a model runs it (torchrun).

A training step packs a NEW batch: every step draws fresh document lengths from the same
distribution (--doc-lens, seed --seed + step) and runs --layers calls of one shape on that
packing, forward (L calls) then backward (L calls), through `token_ring_attn_func(q, k, v,
causal=True, split=split, kernel=K, cuda_graph=...)` (split: `make_split(..., cu_seqlens=cu,
layout=L)`, the packing's documents with it). With graphs on, each half of a packing
runs eagerly once, is captured once and replays for the other layers (ring/training/run.py), so the
step's time carries the capture honestly. Each (layout, kernel) entry times the same packings
with cuda_graph=False (`eager_ms`) and True (`graph_ms`): the slowest rank's step / L, ms per
call (forward + backward), per step and their mean; the two modes alternate which runs a
packing first (the one that runs second finds cuDNN's plans for its segments built). One
warm-up packing (not timed) runs first in each mode. The ring graph cache's counts per step
(captures, replays, dropped, refused) come with them.

--check: at --check-tokens, for --steps packings of --layers layers with their own inputs, every
layer's out/dq/dk/dv with graphs on (the first call of each half eager, the others replays)
against the same call eager (max abs difference) and both against fp64 per-document attention.

On the CPU (gloo) graphs are CUDA-only: cuda_graph=True runs eagerly (`graphs` in the meta
says so) and the two modes must agree bitwise.
"""

from __future__ import annotations

import functools
import json
import statistics

import torch
import torch.distributed as dist
from _packed_ring import (
    _clock,
    _kernel_used,
    _kernels,
    _methods,
    _reference,
    make_row,
    ring_meta,
)


def _stats() -> dict:
    from tokenring_xdit.ring.graph_cache import RING_GRAPHS

    s = RING_GRAPHS.stats
    return dict(captures=s.captures, replays=s.replays, eager=s.eager, dropped=s.dropped,
                refused=len(s.refused))  # fmt: skip


def _delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in after}


def _layers(full, layout, cu, layers: int):
    """`layers` leaf copies of this rank's shards of q, k, v (one per layer), dout's shard and
    the split they were cut by."""
    import tokenring_xdit

    n = dist.get_world_size()
    split = tokenring_xdit.make_split(full[0].shape[1], n, causal=True, cu_seqlens=cu,
                                      layout=layout)  # fmt: skip
    shards = [tokenring_xdit.shard(x, split=split) for x in full]
    made = [[x.detach().clone().requires_grad_() for x in shards[:3]] for _ in range(layers)]
    return made, shards[3].detach(), split


def _step(ins, do, split, kernel, graphs: bool):
    """L forward calls, then their L backward calls (autograd: the last layer's first)."""
    from tokenring_xdit import token_ring_attn_func

    outs = []
    for q, k, v in ins:
        for x in (q, k, v):
            x.grad = None
        outs.append(
            token_ring_attn_func(
                q, k, v, causal=True, split=split, kernel=kernel, cuda_graph=graphs
            )
        )
    torch.autograd.backward(outs, [do] * len(outs))
    return outs


def _method(args, documents, total, layout, kernel, device, dtype, heads) -> dict:
    n, layers = dist.get_world_size(), args.layers
    lists = ("eager_ms_per_call", "graph_ms_per_call", "documents", "layout_used",
             "kernel_used", "graph_stats", "eager_stats")  # fmt: skip
    entry: dict = {name: [] for name in lists}
    for step in range(-1, args.steps):  # step -1: the warm-up packing
        cu = documents(total, step)
        made, do, split = _layers(make_row(total, args.seed, device, dtype, heads), layout, cu,
                                  layers)  # fmt: skip
        modes = (False, True) if step % 2 == 0 else (True, False)
        for graphs in modes:
            before = _stats()
            run = functools.partial(_step, made, do, split, kernel, graphs)
            ms = _clock(run, 0, 1, device, True)[0]
            if step < 0:
                continue
            name = "graph" if graphs else "eager"
            entry[f"{name}_ms_per_call"].append(ms / layers)
            entry[f"{name}_stats"].append(_delta(before, _stats()))
        if step >= 0:  # auto's layout and kernel are per packing
            used = _layout_used(layout, cu, n)
            entry["documents"].append(len(cu) - 1)
            entry["layout_used"].append(used)
            entry["kernel_used"].append(_kernel_used(kernel, used, cu, n, device, dtype, heads))
        del made, do, run
    for name in ("eager", "graph"):
        entry[f"{name}_ms"] = statistics.mean(entry[f"{name}_ms_per_call"])
    entry["speedup"] = entry["eager_ms"] / entry["graph_ms"]
    entry["kernel"] = kernel
    entry["refused"] = _refused()
    return entry


def _layout_used(layout: str, cu, n: int) -> str:
    from tokenring_xdit.ring.packed import document_work

    return document_work(cu, n, causal=True, layout=layout)["layout"]


def _refused() -> list[str]:
    from tokenring_xdit.ring.graph_cache import RING_GRAPHS

    return sorted(set(RING_GRAPHS.stats.refused))[:5]


def _check(args, documents, device, dtype, heads, layouts) -> dict:
    """Per layer: graphs on vs eager (max abs difference) and both vs fp64, worst over layers
    and packings; per packing the graph cache's counts of the graphed run. The fp64 reference
    of a packing's layers is made once for every (layout, kernel)."""
    total, layers = args.check_tokens, args.layers
    methods = list(_methods(layouts, _kernels(args)))
    worst = {name: {w: dict.fromkeys(PARTS, 0.0) for w in COMPARED} for _, _, name in methods}
    counts = {name: [] for _, _, name in methods}
    for step in range(args.steps):
        cu = documents(total, step)
        rows = [make_row(total, args.seed + 1 + i, device, dtype, heads) for i in range(layers)]
        refs = [_reference(cu, *full) for full in rows]
        for layout, kernel, name in methods:
            before = _stats()
            got = {g: _check_layers(rows, layout, cu, kernel, g) for g in (False, True)}
            counts[name].append(_delta(before, _stats()))
            for i, ref in enumerate(refs):
                pairs = {"graph_vs_eager": (got[True][i], got[False][i]),
                         "graph_vs_fp64": (got[True][i], ref),
                         "eager_vs_fp64": (got[False][i], ref)}  # fmt: skip
                for what, (a, b) in pairs.items():
                    for part, x, y in zip(PARTS, a, b, strict=True):
                        err = float((x.double() - y.double()).abs().max())
                        worst[name][what][part] = max(worst[name][what][part], err)
        del rows, refs
    for _, _, name in methods:
        if dist.get_rank() == 0:
            print(f"  check {total} tokens {name}: {json.dumps(worst[name])}", flush=True)
    res = {name: {**worst[name], "graph_stats": counts[name]} for _, _, name in methods}
    return {"tokens": total, "layers": layers, "packings": args.steps, "max_abs": res}


PARTS = ("out", "dq", "dk", "dv")
COMPARED = ("graph_vs_eager", "graph_vs_fp64", "eager_vs_fp64")


def _check_layers(rows, layout, cu, kernel, graphs: bool) -> list[list[torch.Tensor]]:
    """Every layer's (out, dq, dk, dv), whole rows: the forwards, then the backwards (each
    layer its own inputs and dout)."""
    import tokenring_xdit

    ins, dos = [], []
    for full in rows:
        made, do, split = _layers(full, layout, cu, 1)
        ins.append(made[0])
        dos.append(do)
    outs = [
        tokenring_xdit.token_ring_attn_func(
            q, k, v, causal=True, split=split, kernel=kernel, cuda_graph=graphs
        )
        for q, k, v in ins
    ]
    torch.autograd.backward(outs, dos)
    return [
        [tokenring_xdit.unshard(x.detach(), split=split) for x in (o, q.grad, k.grad, v.grad)]
        for o, (q, k, v) in zip(outs, ins, strict=True)
    ]  # fmt: skip


def _table(rows) -> str:
    lines = [f"{'tokens':>7} {'N':>2} {'method':>22} {'eager ms':>9} {'graph ms':>9} "
             f"{'speedup':>7}  captures/replays/dropped per step (graphs on)"]  # fmt: skip
    for r in rows:
        for name, e in r["methods"].items():
            shown = f"{name}:{'/'.join(sorted(set(e['kernel_used'])))}"
            counts = " ".join(f"{s['captures']}/{s['replays']}/{s['dropped']}"
                              for s in e["graph_stats"])  # fmt: skip
            lines.append(
                f"{r['tokens']:>7} {r['ring']:>2} {shown[-22:]:>22} {e['eager_ms']:9.2f} "
                f"{e['graph_ms']:9.2f} {e['speedup']:7.2f}  {counts}"
            )
    return "\n".join(lines)


def main_train_graph(args, documents, device, dtype, heads, layouts) -> None:
    """The --train-graph mode; `documents(total, step)`: the packing of one step."""
    cuda = device.type == "cuda"
    result = {"meta": {}, "rows": []}
    if args.check:
        result["check"] = _check(args, documents, device, dtype, heads, layouts)
    for total in (int(x) for x in args.tokens.split(",") if x):
        row = {"tokens": total, "ring": dist.get_world_size(), "methods": {}}
        for layout, kernel, name in _methods(layouts, _kernels(args)):
            row["methods"][name] = _method(args, documents, total, layout, kernel, device,
                                           dtype, heads)  # fmt: skip
            if cuda:
                from tokenring_xdit.ring.graph_cache import clear_graphs

                clear_graphs()  # this shape's graphs (their buffers) go before the next
                torch.cuda.empty_cache()
        result["rows"].append(row)
    result["meta"] = {
        "mode": "train_graph",
        "graphs": "cuda" if cuda else "eager (CUDA graphs need a GPU: cuda_graph=True ran eagerly)",
        **ring_meta(device, heads),
        "dtype": str(dtype).removeprefix("torch."),
        "layers": args.layers,
        "steps": args.steps,
        "layouts": layouts,
        "kernel": args.kernel,
        "order": args.order,
        "doc_lens": args.doc_lens,
    }
    if dist.get_rank() == 0:
        print(_table(result["rows"]))
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(json.dumps(result["meta"]))
