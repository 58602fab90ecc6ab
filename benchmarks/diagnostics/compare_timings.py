"""How long `tokenring-xdit compare` (the defaults: tiny PixArt, 2 CPU ranks) takes here, a few
runs in a row, each with the machine's load: the range docs/compare.md quotes.

    python benchmarks/diagnostics/compare_timings.py --runs 3 \\
        --out docs/compare/pixart-tiny-timings.json

Each run's wall time is the command's own (`wall_s` of its report: the three launches, not the
start-up of the command) and the whole process's, start to exit.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def one_run(extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "tokenring_xdit.tools.cli", "compare", "--no-progress",
               "--out", out, *extra]  # fmt: skip
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        load = os.getloadavg()[0]
        start = time.monotonic()
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        process_s = time.monotonic() - start
        if done.returncode != 0:
            raise SystemExit(f"compare failed ({done.returncode}): {done.stderr[-2000:]}")
        report = json.loads(next(Path(out).glob("*-compare.json")).read_text())
    return dict(
        wall_s=round(report["wall_s"], 1),
        process_s=round(process_s, 1),
        load_1min_before=round(load, 1),
        load_1min_after=round(os.getloadavg()[0], 1),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--label", default="", help="what else ran on the machine")
    p.add_argument("--out", type=Path)
    p.add_argument("extra", nargs="*", help="more compare arguments (after --)")
    args = p.parse_args()
    runs = []
    for _ in range(args.runs):
        runs.append(one_run(args.extra))
        print(json.dumps(runs[-1]), flush=True)
    result = dict(
        command=" ".join(["tokenring-xdit compare", *args.extra]),
        runs=runs,
        cpus=os.cpu_count(),
        machine=platform.platform(),
        label=args.label,
        date=time.strftime("%Y-%m-%d"),
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
