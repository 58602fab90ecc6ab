"""Does a CUDA-graph launch block the host while an earlier launch of it is still running, and
does an event query from another thread block meanwhile? One GPU, no NCCL.

With replay step marks on (`TOKENRING_XDIT_REPLAY_STEP_MARKS=1`: an external event record node
after every lane wait of a captured ring call), a survivor whose peer stopped never raised: its
main thread sat in `CUDAGraph.replay` and the deadline's watchdog in `Event.query`; without the
marks the same scenario raised in 8.5 s. This isolates the graph from NCCL: a graph of four long
kernels (`torch.cuda._sleep`, standing in for transfers that wait on a stopped peer), each
followed by one of
  - plain:      nothing;
  - external:   an external event record node (what the step marks capture);
  - host_write: a 4-byte device-to-host copy into pinned memory (a mark the host reads without
                a CUDA call);
is launched `--launches` times back to back while a thread queries an ordinary event in a loop.
Per variant: the host seconds of each `replay()` call, and the longest single `query()` call.

    python benchmarks/diagnostics/replay_launch_block.py --spin 2 --out block.json
"""

from __future__ import annotations

import argparse
import json
import platform
import threading
import time
from pathlib import Path

import torch

VARIANTS = ("plain", "external", "host_write")


def _cycles_per_s() -> float:
    """GPU clock, measured: the cycles `_sleep` spins per second of event-timed time."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)  # warm
    start.record()
    torch.cuda._sleep(50_000_000)
    end.record()
    end.synchronize()
    return 50_000_000 / (start.elapsed_time(end) / 1000)


def run_variant(variant: str, spin_s: float, launches: int, rate: float) -> dict:
    marks = 4
    cycles = int(spin_s * rate / marks)
    ext = [torch.cuda.Event(external=True) for _ in range(marks)]
    host = torch.zeros(marks, dtype=torch.int32).pin_memory()
    ones = torch.arange(1, marks + 1, dtype=torch.int32, device="cuda")
    x = torch.zeros(1, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(marks):
            torch.cuda._sleep(cycles)
            if variant == "external":
                ext[i].record()
            elif variant == "host_write":
                host[i : i + 1].copy_(ones[i : i + 1], non_blocking=True)
            x.add_(1)
    torch.cuda.synchronize()

    latest: list[torch.cuda.Event] = []
    longest = [0.0]
    stop = threading.Event()

    def poll() -> None:  # the deadline's watchdog, reduced to its CUDA call
        while not stop.is_set():
            if latest:
                t0 = time.perf_counter()
                latest[-1].query()
                longest[0] = max(longest[0], time.perf_counter() - t0)
            time.sleep(0.002)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    replay_s, host_seen = [], []
    t_start = time.perf_counter()
    for _ in range(launches):
        t0 = time.perf_counter()
        graph.replay()
        replay_s.append(round(time.perf_counter() - t0, 4))
        event = torch.cuda.Event()
        event.record()
        latest.append(event)
        host_seen.append(host.tolist())  # what a host-memory mark shows now (no CUDA call)
    issued_s = time.perf_counter() - t_start
    torch.cuda.synchronize()
    stop.set()
    poller.join()
    return dict(
        variant=variant,
        launches=launches,
        graph_gpu_s=spin_s,
        replay_host_s=replay_s,
        all_issued_after_s=round(issued_s, 4),
        done_after_s=round(time.perf_counter() - t_start, 4),
        longest_query_s=round(longest[0], 4),
        host_marks_seen=host_seen if variant == "host_write" else None,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--spin", type=float, default=2.0, help="GPU seconds of one graph launch")
    p.add_argument("--launches", type=int, default=4)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    rate = _cycles_per_s()
    rows = [run_variant(v, args.spin, args.launches, rate) for v in args.variants.split(",")]
    result = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        machine=platform.node(),
        cycles_per_s=rate,
        rows=rows,
    )
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
