"""The README's test command must reach every test folder.

pytest skips folders matching `norecursedirs` (by default 'dist', 'build', 'venv', ...) without a
word: tests/dist was silently never collected until it was renamed tests/distributed.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_test_folder_is_skipped_by_norecursedirs(pytestconfig):
    patterns = pytestconfig.getini("norecursedirs")
    folders = sorted(p.name for p in TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py")))
    assert "distributed" in folders and "unit" in folders, folders
    skipped = [f for f in folders if any(fnmatch.fnmatch(f, pat) for pat in patterns)]
    assert not skipped, f"pytest would never collect {skipped} (norecursedirs: {patterns})"
