"""Atomic, reversible patch sets: every change records its undo before the next one is tried.

Every change names a patch id that must be a row of the one patch table (table.py), so nothing
can be patched without being listed in `tokenring-xdit patches` and patches/README.md.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import wrapt
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from .. import config
from .table import PATCH_IDS

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


@dataclass
class Switch:
    """A patch set's switch: `enabled`, and `armed` once its post-import hook is registered
    (wrapt keeps every hook it is given: registering twice would apply twice)."""

    enabled: bool = False
    armed: bool = False


# install() / uninstall() (patches/__init__.py) switch hooks that have not fired yet on and off.
HOOKS = Switch(enabled=True)


def enable_hooks(on: bool) -> None:
    HOOKS.enabled = on


def apply_from_hook(trigger: str, apply: Callable[[], object]) -> None:
    """Run a host's `apply` now that `trigger` has been imported; never breaks the host's import
    unless TOKENRING_XDIT_STRICT (the patching scope's one setting, read here, at the hook)."""
    if not HOOKS.enabled:
        return
    try:
        apply()
    except Exception as exc:
        if config.current().strict:
            raise
        log.warning("tokenring_xdit: %s left unpatched: %s", trigger, exc)


def post_import_hook(trigger: str, apply: Callable[[], object]) -> Callable[[Any], None]:
    """The entry-point hook of a host's patch set: `apply` it when `trigger` has been imported."""

    def on_import(module: Any) -> None:
        apply_from_hook(trigger, apply)

    on_import.__doc__ = f"Post-import hook (entry point `{trigger}`)."
    return on_import


class PatchSet:
    """The patches of one host. `apply` runs a build function; on any failure it undoes what was
    done so far, so the host is never left half-patched."""

    def __init__(self, host: str, versions: str):
        self.host = host
        self.versions = versions
        self.applied: list[str] = []
        self._undo: list[Callable[[], None]] = []
        # id(replacement) -> (replacement, original), for wrappers whose aliases (other
        # modules' `from x import name`) are pointed back at the original on revert
        self._aliased: dict[int, tuple[Any, Any]] = {}

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
        _repoint_aliases(self._aliased)
        self._aliased.clear()
        self.applied.clear()

    def _done(self, patch_id: str, undo: Callable[[], None]) -> None:
        if patch_id not in PATCH_IDS:  # a programming error: the audit would be incomplete
            raise RuntimeError(f"patch id {patch_id!r} is not a row of the patch table")
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

    def aliased_wrapper(self, patch_id: str, owner: Any, name: str, wrapper: Callable) -> None:
        """Like `wrapper`, for a function other modules import by name while it is patched:
        revert also points those aliases back at the original."""
        original = owner.__dict__[name]  # the raw function, not a bound method
        handle = wrapt.wrap_function_wrapper(owner, name, wrapper)
        self._aliased[id(handle)] = (handle, original)
        self._done(patch_id, lambda: setattr(owner, name, original))

    def traced_wrapper(self, patch_id: str, owner: Any, name: str, wrapper: Callable) -> Any:
        """Like `wrapper`, for a module-level function that runs inside torch.compile'd models:
        a plain Python function calling wrapper(original, None, args, kwargs). Dynamo takes a
        wrapt proxy for the function it wraps (the proxy forwards __class__ and __code__) and
        traces the ORIGINAL, silently skipping the patch; a plain function it traces. Revert
        restores the original, here and in modules that imported the name meanwhile."""
        original = owner.__dict__[name]

        def patched(*args, **kwargs):
            return wrapper(original, None, args, kwargs)

        functools.update_wrapper(patched, original)  # name, doc, __wrapped__ = original
        setattr(owner, name, patched)
        self._aliased[id(patched)] = (patched, original)
        self._done(patch_id, lambda: setattr(owner, name, original))
        return patched

    def set_attr(self, patch_id: str, owner: Any, name: str, value: Any) -> None:
        """Set a module constant (a shared object such as True: never swept as an alias)."""
        original = owner.__dict__.get(name, _MISSING)
        setattr(owner, name, value)
        self._done(patch_id, lambda: _restore(owner.__dict__, name, original))

    def set_item(self, patch_id: str, mapping: dict, key: Any, value: Any) -> None:
        """Replace mapping[key] (revert puts the original back); `value` may carry a
        `__wrapped__` original, whose aliases revert also restores."""
        original = mapping.get(key, _MISSING)
        mapping[key] = value
        if original is not _MISSING:
            self._aliased[id(value)] = (value, original)
        self._done(patch_id, lambda: _restore(mapping, key, original))

    def on_revert(self, patch_id: str, undo: Callable[[], None]) -> None:
        """Run `undo` on revert: for state a patch creates later (e.g. per-instance changes)."""
        self._done(patch_id, undo)

    def rebind(self, patch_id: str, owner: Any, name: str, expected: Any, new: Any) -> None:
        """Point an alias (from-imported name) at `new`, only if it still is `expected`."""
        if getattr(owner, name, _MISSING) is not expected:
            return
        setattr(owner, name, new)
        self._done(patch_id, lambda: setattr(owner, name, expected))


def _restore(namespace: dict, key: Any, original: Any) -> None:
    if original is _MISSING:
        namespace.pop(key, None)
    else:
        namespace[key] = original


def _repoint_aliases(aliased: dict[int, tuple[Any, Any]]) -> None:
    """Point every module attribute that still holds one of our replacements back at its
    original (modules that did `from xfuser.envs import get_device` while it was patched)."""
    if not aliased:
        return
    for mod in list(sys.modules.values()):
        namespace = getattr(mod, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for attr, value in list(namespace.items()):
            entry = aliased.get(id(value))
            if entry is not None and entry[0] is value:
                namespace[attr] = entry[1]
