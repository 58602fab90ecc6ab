"""Host time of the per-call work a graphed TokenRing call does besides the replay, old vs new.

    # with PYTHONPATH=<checkout>:
    python benchmarks/diagnostics/hot_path_host.py --out $OUT/hot_path_host.json

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="hot_path_host.json")
    args = parser.parse_args()
    from tokenring_xdit.tools.launch import launch

    row = launch(_worker, 2, env={"OMP_NUM_THREADS": "1"}, timeout=300)[0]
    row.update(machine=platform.node(), cpu_count=__import__("os").cpu_count(),
               torch=torch.__version__, repeats=REPEATS)  # fmt: skip
    print(json.dumps(row, indent=1))
    Path(args.out).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
