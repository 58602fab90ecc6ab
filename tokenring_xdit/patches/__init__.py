"""Install / uninstall TokenRing into host libraries, explicitly or from post-import hooks.

Hosts are patched when their trigger module finishes importing (wrapt post-import hooks, armed
by the `.pth` bootstrap through the `tokenring_xdit.post_import_hooks` entry points, or by
`install()`). A hook that fails leaves its host unpatched and logs why; with
TOKENRING_XDIT_STRICT=1 (used by the tests) it raises instead, failing the host's import.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import sys
from types import ModuleType

import wrapt

from .table import PATCH_TABLE, PatchPoint

__all__ = ["install", "uninstall", "installed_patches", "PATCH_TABLE", "PatchPoint"]

log = logging.getLogger("tokenring_xdit")

ENTRY_POINT_GROUP = "tokenring_xdit.post_import_hooks"
STRICT_ENV = "TOKENRING_XDIT_STRICT"

# trigger module -> (patch-set module, hook as "module:function" so wrapt loads it lazily)
HOOKS = {
    host: (f"tokenring_xdit.patches.{host}", f"tokenring_xdit.patches.{host}:on_import")
    for host in ("yunchang", "xfuser")  # yunchang first: xfuser's patches build on it
}

_state = {"enabled": True, "armed": set()}


def _host(trigger: str) -> ModuleType:
    return importlib.import_module(HOOKS[trigger][0])


def _strict() -> bool:
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


def apply_from_hook(trigger: str, module: ModuleType) -> None:
    """Called when `trigger` has been imported; never breaks the host's import unless strict."""
    if not _state["enabled"]:
        return
    try:
        _host(trigger).apply()
    except Exception as exc:
        if _strict():
            raise
        log.warning("tokenring_xdit: %s left unpatched: %s", trigger, exc)


def arm_entry_points() -> None:
    """Register a lazy post-import hook for every entry point of our group (bootstrap path)."""
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        _arm(ep.name, ep.value)


def _arm(trigger: str, hook: str) -> None:
    if (trigger, hook) in _state["armed"]:
        return
    _state["armed"].add((trigger, hook))
    wrapt.register_post_import_hook(hook, trigger)  # fires now if already imported


def install() -> list[str]:
    """Patch every supported host: now if imported, else when it is. Idempotent.

    Unlike the automatic hooks, errors raise here (the caller asked for the patches).
    Returns the ids of the patch points applied so far.
    """
    _state["enabled"] = True
    for trigger, (_, hook) in HOOKS.items():
        if trigger in sys.modules:
            _host(trigger).apply()
        _arm(trigger, hook)
    return installed_patches()


def uninstall() -> None:
    """Revert every applied patch and keep pending hooks from applying. Idempotent."""
    _state["enabled"] = False
    for patch_set in _loaded_patch_sets():
        patch_set.revert()


def installed_patches() -> list[str]:
    """Ids (see PATCH_TABLE) of the patch points currently applied."""
    return [p for patch_set in _loaded_patch_sets() for p in patch_set.PATCHES.applied]


# The torch patch set is applied by our own first graph capture, not by a host import.
RUNTIME_PATCH_SETS = ("tokenring_xdit.patches.torch_dist",)


def _loaded_patch_sets() -> list[ModuleType]:
    """Patch-set modules that may hold applied patches: hosts imported, runtime sets loaded."""
    hosts = [_host(trigger) for trigger in HOOKS if trigger in sys.modules]
    return hosts + [sys.modules[m] for m in RUNTIME_PATCH_SETS if m in sys.modules]
