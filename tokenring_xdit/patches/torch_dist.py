"""torch row of the patch table: the ring's own guard on `destroy_process_group`.

The guard (ring/comm/teardown.py) frees tokenring_xdit's CUDA graphs and TokenRing's ring
communicators before a process group is destroyed (a graph holding NCCL kernels makes
destroy_process_group hang: pytorch/pytorch#115388). The ring puts it in place itself, before a
ring's first communicators and before the first graph capture; this module is its row here:
`ensure_applied` checks torch's version and installs it, `applied` reports it, `revert`
(`tokenring_xdit.uninstall()`) gives torch its own function back.
"""

from __future__ import annotations

from ..ring.comm import teardown
from .base import PatchSet
from .table import TORCH_VERSIONS

PATCH_ID = "torch.destroy_process_group"
PATCHES = PatchSet("torch", TORCH_VERSIONS)


def _build(patches: PatchSet) -> None:
    teardown.ensure_guard()
    patches.on_revert(PATCH_ID, teardown.remove_guard)


def ensure_applied() -> None:
    """Idempotent: install the ring's guard, checked against the table's torch versions."""
    PATCHES.apply(_build)


def applied() -> list[str]:
    """The row's id while the guard is in place (whoever put it there: the ring or us)."""
    return [PATCH_ID] if teardown.guard_installed() else []


def revert() -> None:
    PATCHES.revert()
    teardown.remove_guard()  # also when the ring installed it without us
