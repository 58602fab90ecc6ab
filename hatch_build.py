"""Wheel build hook: ship a snapshot of the committed ring sweeps with the planner.

`tokenring-xdit plan --validate` scores the cost model against the sweep_*.json of
docs/benchmarks/inference-ring-call-h200-2026-11-22/. A
checkout has them; an installed copy would not, so every wheel (not an editable install, which
runs from the checkout) gets them under tokenring_xdit/planner/data/sweeps/ (about 70 kB).
"""

from __future__ import annotations

from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SWEEPS = "tokenring_xdit/planner/data/sweeps"
# the same folder as tokenring_xdit/planner/validate.py's SWEEPS_DIR
SOURCE = ("docs", "benchmarks", "inference-ring-call-h200-2026-11-22")


class SweepSnapshot(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel" or version == "editable":
            return
        files = sorted(Path(self.root, *SOURCE).glob("sweep_*.json"))
        if not files:
            raise RuntimeError(f"no {'/'.join(SOURCE)}/sweep_*.json to ship for plan --validate")
        for path in files:
            build_data["force_include"][str(path)] = f"{SWEEPS}/{path.name}"
