"""The patch audit (patches/README.md), the entry points and the bootstrap triggers agree."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import tomllib

from tests.patches.test_yunchang_patches import ALL_IDS
from tokenring_xdit import _bootstrap
from tokenring_xdit.patches import ENTRY_POINT_GROUP, HOOKS
from tokenring_xdit.patches.table import FIRST_GRAPH_CAPTURE, PATCH_TABLE, to_markdown

ROOT = Path(__file__).resolve().parents[2]


def test_audit_file_is_generated_from_the_table():
    audit = (ROOT / "patches" / "README.md").read_text()
    assert audit == to_markdown(), (
        "regenerate: tokenring-xdit patches --markdown > patches/README.md"
    )


def test_every_patch_point_is_in_the_table_and_applied():
    assert [p.id for p in PATCH_TABLE if p.host == "yunchang"] == ALL_IDS
    assert len({p.id for p in PATCH_TABLE}) == len(PATCH_TABLE)
    assert {p.trigger for p in PATCH_TABLE} <= set(HOOKS) | {FIRST_GRAPH_CAPTURE}


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
