"""`python -m benchmarks <name> [args]`: run one of the sweeps (benchmarks/__init__.SWEEPS) as if
its script were run by path; with no name, list them."""

from __future__ import annotations

import runpy
import sys

from benchmarks import SWEEPS, script


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "list"):
        width = max(map(len, SWEEPS))
        print("python -m benchmarks <name> [args]   (multi-GPU: torchrun ... -m benchmarks ...)")
        for name, (launch, what) in SWEEPS.items():
            print(f"  {name:<{width}}  [{launch}] {what}")
        print("one-off diagnostics: benchmarks/diagnostics/ (run by path)")
        return 0
    name, args = argv[0], argv[1:]
    if name not in SWEEPS:
        print(f"unknown benchmark {name!r}; one of: {', '.join(SWEEPS)}", file=sys.stderr)
        return 2
    path = script(name)
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.parent))  # as when run by path: siblings import each other
    runpy.run_path(str(path), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
