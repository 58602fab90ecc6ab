"""packed_varlen.py --real-ring --profile N: where each rank's time of a packed training call goes.

For every packed (layout, kernel) entry the real ring times, every rank profiles N more calls
(forward + backward) and reports, gathered on rank 0 into the entry's `profile` (one dict per
rank, rank order):
- `timeline`: profile_ring_call.breakdown of the profiled window per call (attention busy, NCCL
  outside attention = transfers in the open or waiting for the peer, merges/copies/other
  outside both, GPU idle), and `kernels_ms` by kind (summed, overlaps counted twice);
- `call_ms`: this rank's own event-timed median from the timed run (waits for peers included);
- `host_issue_ms`: median wall time of the Python call without synchronizing (the host's time to
  issue one call; near `call_ms` the host, not the GPU, sets the pace), and `idle_of_window`:
  GPU idle / window;
- `launches_per_call`: kernels launched per call (GPU activities less memcpy/memset), and
  `activities_per_call` (all of them); on the CPU the profiled ops instead;
- `predicted_ms`: the cost model's (layout_cost) forward + backward compute of this rank with the
  kernel that ran (None where the kernel is not priced), beside `attention_ms` measured;
- `rest_ms`: call_ms - the profiled window (launch latency before the first activity, sync);
- `work`: this rank's planned work (document_work's rank record: pairs, kernel calls, segments,
  varlen calls, tiles, query transfers and returns, predicted ms by kernel);
- `events` (--profile-events): every GPU activity of one more call (kind, stream, start and
  duration in us from its first activity, name), the timeline itself.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
from profile_ring_call import kernel_ms  # noqa: E402  (benchmarks/ is the script's folder)

_NOT_LAUNCHES = ("memcpy", "memset")


def host_issue_ms(step, calls: int, cuda: bool) -> float:
    """Median wall ms of issuing step() (no synchronize inside the clock; ranks start
    together)."""
    times = []
    for _ in range(calls):
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
        if cuda:
            torch.cuda.synchronize()
    return statistics.median(times)


def profile_rank(
    step, calls: int, call_ms: float, work: dict, priced: str | None, cuda: bool,
    events: bool = False,
) -> dict:  # fmt: skip
    """This rank's profile of `calls` calls of step (see the module's docstring); `work` its
    document_work rank record, `priced` the cost table's name of the kernel that ran."""
    issue = host_issue_ms(step, calls, cuda)
    timeline: dict = {}
    found: list = []
    dist.barrier()
    by_kind = kernel_ms(step, calls, timeline, found, cuda=cuda)
    launches = sum(1 for e in found if not e[4].lower().startswith(_NOT_LAUNCHES))
    window = timeline.get("window_ms", 0.0)
    res = {
        "rank": dist.get_rank(),
        "call_ms": call_ms,
        "timeline": timeline,
        "kernels_ms": by_kind,
        "host_issue_ms": issue,
        "idle_of_window": timeline.get("gpu_idle_ms", 0.0) / window if window else None,
        "launches_per_call": launches / calls,
        "activities_per_call": len(found) / calls,
        "predicted_ms": work["predicted_ms_by_kernel"].get(priced),
        "attention_ms": timeline.get("attention_ms"),
        "rest_ms": call_ms - window,
        "work": work,
    }
    if events:
        res["events"] = []
        dist.barrier()
        kernel_ms(step, 1, events=res["events"], cuda=cuda)
    return res


def profile_ranks(
    step, calls: int, ranks_ms: list[float], works: list[dict], priced: str | None, cuda: bool,
    events: bool = False,
) -> list:  # fmt: skip
    """Every rank's profile_rank, gathered (the same list on every rank)."""
    rank = dist.get_rank()
    mine = profile_rank(step, calls, ranks_ms[rank], works[rank], priced, cuda, events)
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


def _f(x, width: int = 7) -> str:
    return f"{x:{width}.2f}" if isinstance(x, (int, float)) else " " * (width - 1) + "-"


def profile_table(rows) -> str:
    """One line per rank of every profiled entry."""
    head = (
        f"{'tokens':>7} {'entry':>18} {'rank':>4} {'call':>7} {'window':>7} {'attn':>7} "
        f"{'model':>7} {'nccl':>7} {'merge':>7} {'idle':>7} {'host':>7} {'launch':>6}"
    )
    lines = ["per rank, ms per call (attn busy; nccl/merge in the open; host: issue time)", head]
    for r in rows:
        for name, e in r["methods"].items():
            for p in e.get("profile", []):
                tl = p["timeline"]
                lines.append(
                    f"{r['tokens']:>7} {name[-18:]:>18} {p['rank']:>4} {_f(p['call_ms'])} "
                    f"{_f(tl.get('window_ms'))} {_f(tl.get('attention_ms'))} "
                    f"{_f(p['predicted_ms'])} {_f(tl.get('nccl_in_the_open_ms'))} "
                    f"{_f(tl.get('merge_copy_other_in_the_open_ms'))} "
                    f"{_f(tl.get('gpu_idle_ms'))} {_f(p['host_issue_ms'])} "
                    f"{p['launches_per_call']:6.0f}"
                )
    return "\n".join(lines)
