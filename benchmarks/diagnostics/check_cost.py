"""What the per-call input check costs: `validate="always"` vs the per-signature cache.

    python benchmarks/diagnostics/check_cost.py --out $OUT/check_cost.json

The check of an NCCL ring runs on a CPU (gloo) communicator of the same ranks: its cost is host
time, the same whatever device the tensors are on, so it is measured here on N CPU processes
(gloo) with the shapes of the smallest sweep rows (PixArt 1024 px: 16 x 72, 4096 tokens; Flux
1024 px: 24 x 128, 4608 tokens; local length = tokens / N). It is reported next to the
committed TokenRing call times at those rows (docs/benchmarks/inference-ring-call-h200-2026-11-22/
sweep_2xH200_nvlink.json, sweep_4xH200_nvlink.json), as a fraction of one call.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import time
from pathlib import Path

import torch

SHAPES = {"pixart_4096": (16, 72, 4096), "flux_4608": (24, 128, 4608)}
REPEATS = 2000


def _worker(rank: int, n: int, report) -> dict:
    import torch.distributed as dist

    from tokenring_xdit.ring.agree import agree, digest
    from tokenring_xdit.ring.comm import RingPosition, setup_token_ring_group
    from tokenring_xdit.ring.seam.prepare import CallOptions
    from tokenring_xdit.ring.split.sharding import make_split, zigzag_positions
    from tokenring_xdit.ring.tensor_layout import BHSD

    setup_token_ring_group(dist.group.WORLD)
    pos = RingPosition.of(None)
    rows = {}
    for name, (heads, dim, tokens) in SHAPES.items():
        s = tokens // n
        q = torch.empty(1, heads, s, dim)  # the check reads shapes only
        base = dict(q=q, k=q, v=q, layout=BHSD, chunks=1, scale=dim**-0.5,
                    kernel=digest("cudnn"))  # fmt: skip
        # a causal call's proof: the split its shards were cut by, or positions (checked
        # against the zigzag split with one host sync, then agreed as that split)
        by_positions = CallOptions(causal=True, positions=zigzag_positions(s * n, rank, n))
        zigzag = make_split(s * n, n, causal=True)
        specs = {
            "signature": _spec(base, False, True, "signature"),
            "always": _spec(base, False, True, "always"),
            "always_causal_split": _spec(base, True, False, "always", zigzag),
        }
        for mode, spec in specs.items():
            rows[f"{name}/{mode}"] = _median_us(functools.partial(agree, spec, pos))
        proved = functools.partial(_proved, base, by_positions, pos, s)
        rows[f"{name}/always_causal_positions"] = _median_us(proved)
    return rows


def _proved(base: dict, options, pos, s: int):
    """The check of a causal call proved by positions: checked against the zigzag split they
    would prove (one host sync), then agreed as that split."""
    from tokenring_xdit.ring.agree import agree
    from tokenring_xdit.ring.agree.proof import call_split

    split = call_split(options, pos.rank, pos.size, s)[0]
    return agree(_spec(base, True, False, "always", split), pos)


def _spec(base: dict, causal: bool, graphs: bool, validate: str, split=None):
    from tokenring_xdit.ring.agree import CallSpec

    more = {} if split is None else {"split": split}
    return CallSpec(**base, causal=causal, graphs=graphs, validate=validate, **more)


def _median_us(check) -> float:
    import torch.distributed as dist

    for _ in range(50):
        check()
    dist.barrier()
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        check()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _call_ms(n: int) -> dict:
    """Committed TokenRing call times (ms) at the two shapes, graph replay, NVLink."""
    root = Path(__file__).resolve().parents[2]
    path = root / "docs" / "benchmarks" / "inference-ring-call-h200-2026-11-22"
    file = path / ("sweep_2xH200_nvlink.json" if n == 2 else "sweep_4xH200_nvlink.json")
    if not file.exists():
        return {}
    found = {}
    for row in json.loads(file.read_text())["rows"]:
        for name, (heads, dim, tokens) in SHAPES.items():
            if (row["heads"], row["head_size"], row["tokens"]) == (heads, dim, tokens):
                found[name] = {"graphed": row["token_ring_ms"], "eager": row["token_ring_eager_ms"]}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="check_cost.json")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    from tokenring_xdit.tools.launch import launch

    result = {
        "machine": platform.node(),
        "cpu_count": __import__("os").cpu_count(),
        "torch": torch.__version__,
        "repeats": REPEATS,
        "unit": "microseconds per input check (checks.agree, median, rank 0)",
        "runs": {},
    }
    for n in args.ranks:
        rows = launch(_worker, n, env={"OMP_NUM_THREADS": "1"}, timeout=300)[0]
        calls = _call_ms(n)
        for name in SHAPES:
            extra = rows[f"{name}/always"] - rows[f"{name}/signature"]
            for kind, ms in calls.get(name, {}).items():
                rows[f"{name}/always_extra_pct_of_{kind}_call"] = 100 * extra / (ms * 1000)
                rows[f"{name}/{kind}_call_ms_committed"] = ms
        result["runs"][str(n)] = rows
        print(n, json.dumps(rows, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
