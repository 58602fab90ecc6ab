"""Install / uninstall TokenRing into host libraries, explicitly or from post-import hooks.

Hosts are patched when their trigger module finishes importing (wrapt post-import hooks, armed
by the `.pth` bootstrap through the `tokenring_xdit.post_import_hooks` entry points, or by
`install()`). A hook that fails leaves its host unpatched and logs why; with
TOKENRING_XDIT_STRICT=1 (used by the tests) it raises instead, failing the host's import.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from types import ModuleType

import wrapt

from ..caches import Seen
from . import torch_dist  # noqa: F401  (the ring's teardown guard's row: uninstall reverts it)
from .base import enable_hooks
from .table import PATCH_TABLE, TRIGGERS, PatchPoint

__all__ = ["install", "uninstall", "installed_patches", "PATCH_TABLE", "PatchPoint"]


ENTRY_POINT_GROUP = "tokenring_xdit.post_import_hooks"

# trigger module -> (patch-set module, hook as "module:function" so wrapt loads it lazily)
HOOKS = {
    host: (f"tokenring_xdit.patches.{host}", f"tokenring_xdit.patches.{host}:on_import")
    for host in TRIGGERS
}

_ARMED = Seen(64)  # (trigger, hook) pairs given to wrapt (one per entry point and host)


def _host(trigger: str) -> ModuleType:
    return importlib.import_module(HOOKS[trigger][0])


def arm_entry_points() -> None:
    """Register a lazy post-import hook for every entry point of our group (bootstrap path)."""
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        _arm(ep.name, ep.value)


def _arm(trigger: str, hook: str) -> None:
    if not _ARMED.first((trigger, hook)):
        return
    wrapt.register_post_import_hook(hook, trigger)  # fires now if already imported


def install() -> list[str]:
    """Patch every supported host: now if imported, else when it is. Idempotent.

    Unlike the automatic hooks, errors raise here (the caller asked for the patches).
    Returns the ids of the patch points applied so far.
    """
    enable_hooks(True)
    for trigger, (_, hook) in HOOKS.items():
        if trigger in sys.modules:
            _host(trigger).apply()
        _arm(trigger, hook)
    return installed_patches()


def uninstall() -> None:
    """Revert every applied patch (host, CPU mode and runtime rows) and keep pending hooks from
    applying. Idempotent."""
    enable_hooks(False)
    for patch_set in reversed(_loaded_patch_sets()):  # xfuser before the yunchang it builds on
        patch_set.revert()


def installed_patches() -> list[str]:
    """Ids (see PATCH_TABLE) of the patch points currently applied."""
    return [p for patch_set in _loaded_patch_sets() for p in _applied_ids(patch_set)]


def _applied_ids(patch_set: ModuleType) -> list[str]:
    # a host set's PatchSet, or a CPU mode's own list (one PatchSet per hooked module)
    own = getattr(patch_set, "applied", None)
    return own() if own is not None else list(patch_set.PATCHES.applied)


# Patch sets applied by something other than a host import: our first graph capture (torch),
# the opt-in CPU modes of xDiT and diffusers. Each module has `revert()` and either PATCHES, like
# the host sets, or `applied()`.
OTHER_PATCH_SETS = (
    "tokenring_xdit.patches.torch_dist",
    "tokenring_xdit.patches.xfuser_cpu",
    "tokenring_xdit.patches.diffusers_cpu",
)


def _loaded_patch_sets() -> list[ModuleType]:
    """Patch-set modules that may hold applied patches: hosts imported, other sets loaded."""
    hosts = [_host(trigger) for trigger in HOOKS if trigger in sys.modules]
    return hosts + [sys.modules[m] for m in OTHER_PATCH_SETS if m in sys.modules]
