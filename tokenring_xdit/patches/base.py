"""Atomic, reversible patch sets: every change records its undo before the next one is tried."""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable
from typing import Any

import wrapt
from packaging.specifiers import SpecifierSet
from packaging.version import Version

log = logging.getLogger("tokenring_xdit")

_MISSING = object()


class UnsupportedHostVersion(RuntimeError):
    """The installed host library is a version these patches were not written against."""


def check_host_version(dist: str, spec: str) -> str:
    version = importlib.metadata.version(dist)
    if Version(version) not in SpecifierSet(spec):
        raise UnsupportedHostVersion(
            f"{dist} {version} is not a version tokenring_xdit supports ({dist}{spec}); "
            f"nothing of {dist} was patched. Install a supported {dist} or a newer tokenring-xdit."
        )
    return version


class PatchSet:
    """The patches of one host. `apply` runs a build function; on any failure it undoes what was
    done so far, so the host is never left half-patched."""

    def __init__(self, host: str, versions: str):
        self.host = host
        self.versions = versions
        self.applied: list[str] = []
        self._undo: list[Callable[[], None]] = []

    @property
    def active(self) -> bool:
        return bool(self.applied)

    def apply(self, build: Callable[[PatchSet], None]) -> bool:
        """Apply once; returns False when already applied (idempotent)."""
        if self.active:
            return False
        check_host_version(self.host, self.versions)
        try:
            build(self)
        except BaseException:
            self.revert()
            raise
        return True

    def revert(self) -> None:
        while self._undo:
            self._undo.pop()()
        self.applied.clear()

    def _done(self, patch_id: str, undo: Callable[[], None]) -> None:
        self._undo.append(undo)
        if patch_id not in self.applied:
            self.applied.append(patch_id)

    def registry_entry(self, patch_id: str, mapping: dict, key: str, value: Any) -> None:
        old = mapping.get(key, _MISSING)
        if old is not _MISSING:
            raise RuntimeError(f"{patch_id}: key {key!r} already taken by {old!r}")
        mapping[key] = value
        self._done(patch_id, lambda: mapping.pop(key, None))

    def list_entry(self, patch_id: str, items: list, value: Any) -> None:
        if value in items:
            raise RuntimeError(f"{patch_id}: {value!r} is already listed")
        items.append(value)
        self._done(patch_id, lambda: items.remove(value))

    def missing_symbol(self, patch_id: str, owner: Any, name: str, value: Any) -> None:
        """Add owner.name only where the host lacks it (a name a newer host release has)."""
        if hasattr(owner, name):
            return
        setattr(owner, name, value)
        self._done(patch_id, lambda: delattr(owner, name))

    def wrapper(self, patch_id: str, owner: Any, name: str, wrapper: Callable) -> Any:
        """Wrap owner.name with a wrapt FunctionWrapper; returns the wrapper (the handle)."""
        handle = wrapt.wrap_function_wrapper(owner, name, wrapper)
        self._done(patch_id, lambda: wrapt.unwrap_object(owner, name, handle))
        return handle

    def rebind(self, patch_id: str, owner: Any, name: str, expected: Any, new: Any) -> None:
        """Point an alias (from-imported name) at `new`, only if it still is `expected`."""
        if getattr(owner, name, _MISSING) is not expected:
            return
        setattr(owner, name, new)
        self._done(patch_id, lambda: setattr(owner, name, expected))
