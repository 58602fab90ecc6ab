"""tests/xdist_scopes.py: the test files that read one cached launch form one pytest-xdist unit
(split over workers, each worker would make the launch again)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.xdist_scopes import SharedLaunchScheduling, declared_scopes

ROOT = Path(__file__).resolve().parents[2]


def test_every_file_reading_the_xdit_cpu_launches_declares_their_unit():
    readers = sorted(
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "tests").rglob("test_*.py")
        if re.search(r"\bcpu_launch\(", p.read_text(encoding="utf-8"))
    )
    assert len(readers) >= 3, readers  # test_usp, test_long_ctx, test_pipelines at least
    scopes = declared_scopes(ROOT)
    assert {f: scopes.get(f) for f in readers} == dict.fromkeys(readers, "tests/xdit/launches.py")


def test_declared_files_share_one_unit_and_others_keep_their_own():
    scheduler = object.__new__(SharedLaunchScheduling)  # _split_scope reads only the scopes
    scheduler._scopes = declared_scopes(ROOT)
    units = {
        scheduler._split_scope(node)
        for node in (
            "tests/xdit/test_usp.py::test_a[ring2]",
            "tests/xdit/test_long_ctx.py::test_b",
            "tests/xdit/test_pipelines.py::test_c",
        )
    }
    assert units == {"tests/xdit/launches.py"}
    own = "tests/distributed/test_bad_input.py"
    assert scheduler._split_scope(f"{own}::test_rank_outside_the_group") == own
