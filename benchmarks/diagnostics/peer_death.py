"""A peer that dies, hangs or raises in the middle of a TokenRing loop: what the survivor sees,
per path x fault x launcher, on GPUs (NCCL) or CPU (gloo). The scenarios, their launchers and
worker are tests/peer_faults/ (the tests run the same lists); this is their command line.

Two ranks run tests/peer_faults/worker.py (its docstring: the paths and faults); rank 1 faults
at call `--fault-at`, rank 0 keeps calling and exits 3 when it catches TokenRingCommError. Per
scenario, as JSON: for every survivor its first error (type, message, call, thread), seconds
from the fault to that error, exit code (-6: SIGABRT; -9: killed by the harness after the wall;
None under torchrun when the agent stopped it), whether the message names the faulty rank
("global rank 1") and the step ("step N"); torchrun's exit code and the rank its report blames.
One scenario:

    python benchmarks/diagnostics/peer_death.py --path train --fault die --launcher plain
    python benchmarks/diagnostics/peer_death.py --path infer_graphed --fault hang \
        --launcher torchrun --out hang.json
    python benchmarks/diagnostics/peer_death.py --device cpu --tokens 256 --deadline 3

A list of scenarios (`--matrix gpu` or `cpu`: tests/peer_faults/scenarios.py's GPU_MATRIX /
CPU_MATRIX), `--jobs` at a time, within `--budget` seconds (scenarios not started by then are
listed as not run):

    python benchmarks/diagnostics/peer_death.py --matrix gpu --jobs 6 --budget 270 --out m.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.diagnostics.peer_table import table  # noqa: E402
from tests.peer_faults.scenarios import (  # noqa: E402
    CPU_MATRIX,
    GPU_MATRIX,
    LAUNCHERS,
    Scenario,
    run,
    run_many,
)
from tests.peer_faults.worker import FAULTS, PATHS  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--path", choices=PATHS, default="train")
    p.add_argument("--mode", choices=("train", "infer"), help="old name: infer is --path "
                   "infer_graphed, or infer_eager with --graphs 0")  # fmt: skip
    p.add_argument("--graphs", type=int, default=1, help="old: with --mode infer")
    p.add_argument("--fault", choices=FAULTS, default="die")
    p.add_argument("--launcher", choices=LAUNCHERS, default="plain")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--fault-at", "--die-at", dest="fault_at", type=int, default=30)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--deadline", "--timeout", dest="deadline", type=float, default=8.0,
                   help="TOKENRING_XDIT_TIMEOUT")  # fmt: skip
    p.add_argument("--max-restarts", type=int, default=0, help="torchrun's")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="more environment for the ranks (repeat)")  # fmt: skip
    p.add_argument("--wall", type=float, default=120.0, help="kill everything after this")
    p.add_argument("--matrix", choices=("gpu", "cpu"), help="run that list instead")
    p.add_argument("--only", help="matrix: just these scenarios (comma-separated names); "
                   "--env then adds to each one's environment")  # fmt: skip
    p.add_argument("--jobs", type=int, default=1, help="matrix: scenarios at a time")
    p.add_argument("--budget", type=float, help="matrix: start no scenario after this (s)")
    p.add_argument("--out", type=Path)
    p.add_argument("--table", type=Path, help="print a matrix JSON as markdown rows, and stop")
    args = p.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())["scenarios"]))
        return
    start = time.time()
    if args.matrix:
        scenarios = list(GPU_MATRIX if args.matrix == "gpu" else CPU_MATRIX)
        if args.only:
            names = set(args.only.split(","))
            unknown = names - {s.name for s in scenarios}
            if unknown:
                p.error(f"--only: not in the {args.matrix} matrix: {sorted(unknown)}")
            extra = tuple(tuple(e.split("=", 1)) for e in args.env)
            scenarios = [dataclasses.replace(s, env=s.env + extra) for s in scenarios
                         if s.name in names]  # fmt: skip
        head = dict(matrix=args.matrix, jobs=args.jobs, budget_s=args.budget, partial=True)

        def keep(done: list) -> None:  # written as results come: a killed run keeps them
            if args.out:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(head | dict(scenarios=done), indent=1) + "\n")

        done = run_many(scenarios, args.jobs, args.budget, on_result=keep)
        result: dict = head | dict(partial=False, scenarios=done)
    else:
        if args.mode:
            graphed = "infer_graphed" if args.graphs else "infer_eager"
            args.path = "train" if args.mode == "train" else graphed
        result = run(Scenario(
            args.path, args.fault, args.launcher, args.device, args.tokens, calls=args.calls,
            fault_at=args.fault_at, deadline=args.deadline, max_restarts=args.max_restarts,
            wall=args.wall, env=tuple(tuple(e.split("=", 1)) for e in args.env),
        ))  # fmt: skip
    result |= dict(machine=platform.node(), total_wall_s=round(time.time() - start, 1),
                   command=" ".join(sys.argv))  # fmt: skip
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
