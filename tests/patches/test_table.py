"""The patch audit (patches/README.md), the entry points and the bootstrap triggers agree."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import tomllib

from tests.patches.test_yunchang_patches import ALL_IDS
from tests.speed import scaled
from tokenring_xdit import _bootstrap
from tokenring_xdit.patches import ENTRY_POINT_GROUP, HOOKS
from tokenring_xdit.patches.audit import to_markdown
from tokenring_xdit.patches.table import (
    AUTOMATIC,
    CPU_MODE,
    FIRST_GRAPH_CAPTURE,
    PATCH_TABLE,
    RUNTIME,
)

ROOT = Path(__file__).resolve().parents[2]


def test_audit_file_is_generated_from_the_table():
    audit = (ROOT / "patches" / "README.md").read_text()
    assert audit == to_markdown(), (
        "regenerate: tokenring-xdit patches --markdown > patches/README.md"
    )


def test_every_patch_point_is_in_the_table_and_applied():
    assert [p.id for p in PATCH_TABLE if p.host == "yunchang"] == ALL_IDS
    # one id may patch several modules (CPU mode), never the same module twice
    assert len({(p.id, p.trigger) for p in PATCH_TABLE}) == len(PATCH_TABLE)
    assert [p.trigger for p in PATCH_TABLE if p.switch == RUNTIME] == [FIRST_GRAPH_CAPTURE]
    assert {p.trigger for p in PATCH_TABLE if p.switch == AUTOMATIC} == set(HOOKS)
    assert all(p.trigger.startswith(p.host + ".") for p in PATCH_TABLE if p.switch == CPU_MODE)


def test_entry_points_hooks_and_triggers_agree():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][
        ENTRY_POINT_GROUP
    ]
    assert declared == {trigger: hook for trigger, (_, hook) in HOOKS.items()}
    assert set(_bootstrap.TRIGGERS) == set(declared)
    installed = {
        ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    }
    assert installed == declared, (
        "reinstall the package (pip install -e .) after editing entry points"
    )


EVERYTHING = textwrap.dedent(
    """
    import json, os
    os.environ["TOKENRING_XDIT_AUTOPATCH"] = "0"
    import tokenring_xdit
    from tokenring_xdit.patches import diffusers_cpu, torch_dist, xfuser_cpu
    xfuser_cpu.enable()
    diffusers_cpu.enable()
    tokenring_xdit.install()
    import importlib, xfuser
    for name in xfuser_cpu.hooked_modules():
        importlib.import_module(name)
    import diffusers.models.attention_dispatch  # applies the diffusers rows
    torch_dist.ensure_applied()  # what the first CUDA graph capture does
    report = dict(
        applied=tokenring_xdit.installed_patches(),
        cpu_modules=sorted(xfuser_cpu._MODE.applied),
    )
    tokenring_xdit.uninstall()
    report["after"] = tokenring_xdit.installed_patches()
    print(json.dumps(report))
    """
)


def test_every_row_is_applied_and_nothing_unlisted():
    """Patch points listed == patch points that exist: install everything (host hooks, CPU mode
    in every module it hooks, the runtime torch row), then uninstall everything. PatchSet refuses
    ids that are not rows, so nothing applied can be missing from the table."""
    proc = subprocess.run(
        [sys.executable, "-c", EVERYTHING], capture_output=True, text=True, timeout=scaled(300)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(report["applied"]) == sorted({p.id for p in PATCH_TABLE})
    xfuser_cpu_rows = [p for p in PATCH_TABLE if p.switch == CPU_MODE and p.host == "xfuser"]
    assert report["cpu_modules"] == sorted({p.trigger for p in xfuser_cpu_rows})
    assert report["after"] == []


def test_cpu_mode_doc_lists_every_xfuser_cpu_row():
    """docs/cpu-mode.md's table names every xfuser CPU-mode row of the patch table."""
    from tokenring_xdit.patches.table import CPU_MODE, PATCH_TABLE

    doc = (ROOT / "docs" / "cpu-mode.md").read_text()
    rows = [p.id for p in PATCH_TABLE if p.switch == CPU_MODE and p.id.startswith("xfuser_cpu.")]
    missing = [pid for pid in rows if f"| `{pid}` |" not in doc]
    assert rows and not missing, f"docs/cpu-mode.md lacks rows for {missing}"
