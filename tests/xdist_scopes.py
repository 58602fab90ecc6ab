"""pytest-xdist work units for `--dist loadfile`: one per test file, except that test files which
read one cached launch (launches made once per worker process, e.g. tests/xdit/launches.py's
`cpu_launch`) form one unit together. Split over two workers, such files would make the same
launch twice (each about a minute of CPU on 2 cores).

A test file joins a unit by a module-level line `XDIST_SCOPE = "<name>"`; the files naming the
same unit run on one worker, one after the other.
"""

from __future__ import annotations

import re
from pathlib import Path

from xdist.scheduler import LoadFileScheduling

_DECLARED = re.compile(r'^XDIST_SCOPE = "([^"]+)"$', re.MULTILINE)


def declared_scopes(root: Path) -> dict[str, str]:
    """Test file (its path relative to `root`, as node ids give it) -> the unit it declares."""
    scopes = {}
    for path in sorted((root / "tests").rglob("test_*.py")):
        found = _DECLARED.search(path.read_text(encoding="utf-8"))
        if found:
            scopes[path.relative_to(root).as_posix()] = found.group(1)
    return scopes


class SharedLaunchScheduling(LoadFileScheduling):
    """LoadFileScheduling with the declared files of one unit kept together."""

    def __init__(self, config, log=None) -> None:
        super().__init__(config, log)
        self._scopes = declared_scopes(Path(config.rootpath))

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return self._scopes.get(path, path)
