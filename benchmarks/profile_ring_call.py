"""Where one TokenRing call's time goes: kernel time by kind, per call, vs the kernel alone.

  torchrun --nproc_per_node=2 benchmarks/profile_ring_call.py --out $OUT/ring_call_profile.json
For each shape: the graphed TokenRing call (as in ring_sweep.py) timed with CUDA events, then 20
calls under torch.profiler; the kernels are summed by kind (attention, NCCL, merge, copies,
other) and compared with the same per-block cuDNN kernels run alone, back to back, on one GPU.
`attention_inflation` = attention kernel time inside the ring / the same kernels alone: above 1
the NCCL kernels running beside the attention kernel slow it down (they share SMs and memory).
`exposed_ms` = call time - attention time inside the ring: what the overlap did not hide.
`timeline` splits the profiled window per call (breakdown()): attention busy, NCCL outside
attention (transfers in the open, or waiting for the peer), merges/copies outside both, and
time with no GPU work at all (host gaps, launches, waits between streams).
`--defer 0 0.5` profiles each shape once per `defer_own` (0: the own block whole at step 0).
`--events` adds `events`: every GPU activity of one call on its own (kind, stream, start and
duration in us from the call's first activity), to read the order a timeline sum hides.
`--eager` profiles the call without CUDA graphs (`cuda_graph=False`, ring_sweep's
token_ring_eager): its timeline's `idle` is then the host's gaps between launches. The script
uses only the public API, so run with PYTHONPATH at an older package it profiles that one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

import torch
import torch.distributed as dist
from ring_sweep import SHAPES, time_ms  # noqa: E402  (benchmarks/ is the script's folder)

KINDS = (
    ("attention", ("sdpa", "flash", "fmha", "cudnn", "attn")),
    ("nccl", ("nccl", "gloo")),  # gloo: profile_train_call.py's CPU smoke run
    ("merge", ("merge", "triton", "logsumexp", "exp", "sigmoid")),
    ("copy", ("copy", "memcpy")),
)


def _kind(name: str) -> str:
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


# --- the timeline: what ran with nothing to hide it ---------------------------------------
# Intervals are (start_ns, end_ns) of CUDA activities (kernels, memcpy/memset) from the
# profiler's trace, grouped by kind. An NCCL kernel also runs while it waits for its peer, so
# "nccl in the open" is transfer time plus waiting for the other rank.

Interval = tuple[int, int]


def union(intervals: list[Interval]) -> list[Interval]:
    """Sorted, non-overlapping cover of `intervals`."""
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def length(intervals: list[Interval]) -> int:
    return sum(end - start for start, end in union(intervals))


def overlap(a: list[Interval], b: list[Interval]) -> int:
    """Length of the time covered by both `a` and `b`."""
    a, b = union(a), union(b)
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def in_the_open(kind: list[Interval], hiding: list[Interval]) -> int:
    """Time `kind` ran while nothing of `hiding` did."""
    return length(kind) - overlap(kind, hiding)


def breakdown(by_kind: dict[str, list[Interval]], calls: int) -> dict[str, float]:
    """ms per call: the window from the first to the last activity, attention busy time, NCCL
    time outside attention, merges/copies/other outside both, and time with no GPU work at all
    (host gaps, launches, waits between the streams)."""
    everything = [iv for ivs in by_kind.values() for iv in ivs]
    if not everything:
        return {}
    window = max(e for _, e in everything) - min(s for s, _ in everything)
    attention = by_kind.get("attention", [])
    nccl = by_kind.get("nccl", [])
    rest = [iv for kind, ivs in by_kind.items() if kind not in ("attention", "nccl") for iv in ivs]
    per_call = 1e6 * calls  # ns -> ms per call
    return dict(
        window_ms=window / per_call,
        attention_ms=length(attention) / per_call,
        nccl_in_the_open_ms=in_the_open(nccl, attention) / per_call,
        merge_copy_other_in_the_open_ms=in_the_open(rest, attention + nccl) / per_call,
        gpu_idle_ms=(window - length(everything)) / per_call,
    )


def kernel_ms(
    fn, calls: int, timeline: dict | None = None, events: list | None = None, cuda: bool = True
) -> dict[str, float]:
    """ms per call by kind; `timeline` (if given) receives breakdown() of the same window,
    `events` (if given) every activity as [kind, stream, start_us, duration_us, name].
    `cuda=False`: the CPU ops instead (nested, so only a smoke test's numbers)."""
    from torch.profiler import ProfilerActivity, profile

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
        sync()
    by_kind: dict[str, list] = defaultdict(list)  # the trace's GPU activities, read once
    found = []
    device = "CUDA" if cuda else "CPU"
    for e in prof.profiler.kineto_results.events():
        if e.device_type().name == device:
            kind, span = _kind(e.name()), (e.start_ns(), e.end_ns())
            by_kind[kind].append(span)
            found.append((*span, kind, e.device_resource_id(), e.name()))
    if events is not None and found:
        t0 = min(f[0] for f in found)
        events += [
            [kind, stream, round((s - t0) / 1e3, 2), round((e - s) / 1e3, 2), name[:48]]
            for s, e, kind, stream, name in sorted(found)
        ]
    if timeline is not None:
        timeline.update(breakdown(by_kind, calls))
    return {kind: sum(e - s for s, e in ivs) / 1e6 / calls for kind, ivs in by_kind.items()}


def _profile_shape(
    group, rank: int, n: int, model: str, heads: int, dim: int, tokens: int, defer: float | None,
    events: bool = False, eager: bool = False,
):  # fmt: skip
    from tokenring_xdit.config import current
    from tokenring_xdit.ring import token_ring_attn
    from tokenring_xdit.ring.kernels import KERNELS
    from tokenring_xdit.ring.tensor_layout import get_layout

    gen = torch.Generator(device="cuda").manual_seed(rank)
    q, k, v = (
        torch.randn(1, heads, tokens // n, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
        for _ in range(3)
    )
    lay = get_layout("bhsd")
    cfg = current() if defer is None else current().replace(defer_own=defer)

    def ring():
        return token_ring_attn(
            q, k, v, group=group, layout="bhsd", kernel="cudnn", config=cfg,
            cuda_graph=False if eager else None,
        )  # fmt: skip

    def blocks_alone():  # the n per-block kernels a rank runs in one ring call
        for _ in range(n):
            KERNELS["cudnn"](q, k, v, dim**-0.5, lay)

    call_ms = time_ms(ring, 50, 10)
    timeline: dict = {}
    in_ring = kernel_ms(ring, 20, timeline)
    alone = kernel_ms(blocks_alone, 20)
    row = dict(
        model=model,
        heads=heads,
        head_size=dim,
        tokens=tokens,
        ring=n,
        rank=rank,
        defer_own=cfg.defer_own,
        graphed=not eager,
        call_ms=call_ms,
        kernels_in_ring_ms=in_ring,
        attention_alone_ms=alone.get("attention"),
        timeline=timeline,
    )
    if events:
        row["events"] = []
        kernel_ms(ring, 1, events=row["events"])
    row["attention_inflation"] = in_ring.get("attention", 0) / alone["attention"]
    row["exposed_ms"] = call_ms - in_ring.get("attention", 0)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", nargs="+", default=["flux:16896", "pixart:16384", "pixart:4096"])
    ap.add_argument("--defer", nargs="+", type=float, default=[None], help="defer_own values")
    ap.add_argument("--events", action="store_true", help="every GPU activity of one call")
    ap.add_argument("--eager", action="store_true", help="the call without CUDA graphs")
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
            rows.append(
                _profile_shape(
                    group, rank, n, model, heads, dim, tokens, defer, args.events, args.eager
                )
            )
            if rank == 0:
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "events"}), flush=True)
    if rank == 0:
        write_result(args.out, "profile_ring_call", n, rows)
    dist.destroy_process_group()


def write_result(path: str, script: str, n: int, rows: list, cuda: bool = True) -> None:
    """{"meta": machine, versions, NCCL_* settings, the command; "rows": rows} as JSON."""
    meta = dict(
        gpu=torch.cuda.get_device_name() if cuda else "cpu",
        torch=torch.__version__,
        nccl=".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        cudnn=torch.backends.cudnn.version() if cuda else None,
        nccl_env={k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")},
        command=f"torchrun --nproc_per_node={n} benchmarks/{script}.py " + " ".join(sys.argv[1:]),
    )
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
