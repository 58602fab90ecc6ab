"""Launch the set-up + calls + no-destroy program of tests/distributed/test_exit.py many times
and count exit codes (issue: a correct program must never abort at exit).

    python benchmarks/diagnostics/exit_launches.py --launches 100 \
        --out docs/benchmarks/one-gpu-h100-2026-11-25/exit_launches.json
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.distributed.test_exit import PROGRAM, launch  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--launches", type=int, default=100)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    codes: collections.Counter = collections.Counter()
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "prog.py"
        path.write_text(PROGRAM)
        for _ in range(args.launches):
            done = launch(path, args.ranks)
            aborted = "terminate called" in done.stderr
            codes[f"rc={done.returncode}" + (" (terminate called)" if aborted else "")] += 1
    result = dict(
        launches=args.launches,
        ranks=args.ranks,
        exit_codes=dict(codes),
        seconds=round(time.monotonic() - start, 1),
        machine=platform.platform(),
        python=sys.version.split()[0],
        command=" ".join(sys.argv),
    )
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
