"""Host time of the per-call work a graphed TokenRing call does besides the replay, old vs new.

    # with PYTHONPATH=<checkout>:
    python benchmarks/diagnostics/hot_path_host.py --out $OUT/hot_path_host.json
    python benchmarks/diagnostics/hot_path_host.py --path eager --ranks 4 --out eager.json

`--path eager` times whole eager inference calls instead (`token_ring_attn(cuda_graph=False)`,
non-causal, cpu_flash) at a tiny shape (1 x 4 heads x 16 tokens x 32 per rank), so the call is
its host work plus gloo's transfers; it also counts the Python function calls of one call under
cProfile (a count does not depend on the machine's load) and lists the functions with the most
own time (`--top`). Made for "the eager path must never get slower": run it with
PYTHONPATH=<old checkout> and <new checkout>, alternating.

Runs 2 gloo ranks on CPU (the host side is the same whatever the device) at the smallest sweep
shape (PixArt 1024 px: 16 x 72, 4096 tokens), validate "signature" (what NCCL rings use), and
times, per call: the input check from its cache, building the call and the graph key, and the
graph-cache lookup. Works on the code before issue 21 (`checks.check_inputs`) and after
(`checks.agree`), so one machine compares both.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

REPEATS = 5000
EAGER_REPEATS = 1000
PROFILED = 200


def _worker(rank: int, n: int, report) -> dict:
    import torch.distributed as dist

    import tokenring_xdit
    from tokenring_xdit.config import current
    from tokenring_xdit.ring import agree as checks
    from tokenring_xdit.ring.comm import RingPosition, setup_token_ring_group
    from tokenring_xdit.ring.forward import RingCall
    from tokenring_xdit.ring.kernels import KERNELS
    from tokenring_xdit.ring.layout import BHSD
    from tokenring_xdit.ring.schedules import NON_CAUSAL

    setup_token_ring_group(dist.group.WORLD)
    pos = RingPosition.of(None)
    q = torch.empty(1, 16, 4096 // n, 72)
    graphs: dict = {}
    new = hasattr(checks, "agree")

    def one_call():
        cfg = current()
        scale = q.shape[-1] ** -0.5
        if new:
            spec = checks.CallSpec(
                q, q, q, BHSD, False, 1, scale, checks.digest("cudnn"), True, "signature"
            )
            ring = checks.agree(spec, pos)
            q_lens, agreed = ring.q_lens, ring.key
        else:
            shapes = checks.check_inputs(q, q, q, BHSD, False, 1, scale, pos, None, "signature")
            q_lens, agreed = shapes.q_lens, ()
        call = RingCall(NON_CAUSAL, KERNELS["math"], "cudnn", BHSD, scale,
                        min(1, min(q_lens)), "rear", cfg.fused_merge)  # fmt: skip
        signature = tuple((x.shape, x.stride(), x.dtype) for x in (q, q, q))
        key = (pos.group, agreed, call.graph_key(), signature)
        return graphs.setdefault(key, key)

    for _ in range(200):
        one_call()
    dist.barrier()
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        one_call()
        times.append(time.perf_counter() - t0)
    return {
        "version": "agreed ring (issue 21)" if new else "before issue 21",
        "package": str(Path(tokenring_xdit.__file__).parent),
        "median_us": statistics.median(times) * 1e6,
        "p90_us": sorted(times)[int(0.9 * len(times))] * 1e6,
    }


def _name(file: str, line: int, name: str) -> str:
    """A profiled function as package/module:line:name (no machine paths)."""
    parts = Path(file).parts
    where = (
        "/".join(parts[parts.index("tokenring_xdit") :])
        if "tokenring_xdit" in parts
        else Path(file).name
    )
    return f"{where}:{line}:{name}"


def _eager_worker(rank: int, n: int, report, top: int, repeats: int) -> dict:
    import cProfile
    import pstats

    import torch.distributed as dist

    from tokenring_xdit.ring import token_ring_attn

    torch.manual_seed(rank)
    q, k, v = (torch.randn(1, 4, 16, 32) for _ in range(3))

    def one_call():
        return token_ring_attn(q, k, v, layout="bhsd", kernel="cpu_flash", cuda_graph=False)

    for _ in range(min(100, repeats)):
        one_call()
    dist.barrier()
    times, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.thread_time()
        one_call()
        cpu.append(time.thread_time() - c0)  # this thread's CPU: not the waits for the peer
        times.append(time.perf_counter() - t0)
    dist.barrier()
    profiled = min(PROFILED, repeats)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(profiled):
        one_call()
    prof.disable()
    stats = pstats.Stats(prof)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])
    comm = sum(c[2] for (_, _, name), c in rows if "_distributed_c10d" in name)
    return {
        "version": "eager call",
        "ranks": n,
        "median_us": statistics.median(times) * 1e6,
        "p90_us": sorted(times)[int(0.9 * len(times))] * 1e6,
        "cpu_us": statistics.median(cpu) * 1e6,
        "python_calls_per_call": stats.total_calls / profiled,
        # under the profiler (slower than without it), less the time inside c10d's calls
        "profiled_us_less_comm": (stats.total_tt - comm) / profiled * 1e6,
        "calls_per_call": {
            _name(f, line, name): c[1] / profiled
            for (f, line, name), c in sorted(stats.stats.items())
        },
        "top_own_time": [
            {
                "function": _name(f, line, name),
                "calls_per_call": c[1] / profiled,
                "own_us_per_call": c[2] / profiled * 1e6,
            }  # fmt: skip
            for (f, line, name), c in rows[:top]
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="hot_path_host.json")
    parser.add_argument("--path", choices=("graphed", "eager"), default="graphed")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--top", type=int, default=25, help="eager: functions listed")
    parser.add_argument("--label", default="", help="eager: which code (recorded as given)")
    parser.add_argument("--repeats", type=int, default=EAGER_REPEATS, help="eager: timed calls")
    args = parser.parse_args()
    from tokenring_xdit.tools.launch import launch

    env = {"OMP_NUM_THREADS": "1"}
    if args.path == "eager":
        row = launch(_eager_worker, args.ranks, (args.top, args.repeats), env=env, timeout=600)[0]
        repeats = args.repeats
        row["label"] = args.label
    else:
        row = launch(_worker, args.ranks, env=env, timeout=300)[0]
        repeats = REPEATS
    row.update(machine=platform.node(), cpu_count=__import__("os").cpu_count(),
               torch=torch.__version__, repeats=repeats,
               load_avg=__import__("os").getloadavg())  # fmt: skip
    print(json.dumps(row, indent=1))
    Path(args.out).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
