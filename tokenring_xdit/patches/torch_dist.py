"""torch patch: free tokenring_xdit's CUDA graphs before a process group is destroyed.

A CUDA graph that captured NCCL kernels keeps its communicator in use, and torch's
`destroy_process_group` then waits forever in ncclCommDestroy (pytorch/pytorch#115388, open;
seen here on 2 x H200 with torch 2.11). xDiT's scripts end with `destroy_distributed_env()`, so
without this every run that replayed a TokenRing or transformer graph would hang at exit. The
same wrapper destroys TokenRing's own ring communicators first, in order, and empties the
caches that hold the group (a group kept alive past its destroy keeps its gloo threads, which
abort the process at interpreter exit: ring/comm/groups.py).
Applied before a ring's first communicators are made and before the first graph is captured
(ring/graphs.py names `ensure_applied` as its guard and imports it then);
`tokenring_xdit.uninstall()` reverts it.
"""

from __future__ import annotations

import gc

from ..ring import comm, graphs
from .base import PatchSet
from .table import TORCH_VERSIONS

PATCHES = PatchSet("torch", TORCH_VERSIONS)


def release_graphs() -> None:
    """Drop every CUDA graph tokenring_xdit holds (TokenRing calls and graphed transformers)."""
    if graphs.release_all_graphs():
        # a graph is destroyed with its last reference; collect only when graphs were dropped:
        # xDiT destroys a dozen groups at exit and a full collection each cost seconds there
        gc.collect()


def _destroy_process_group(wrapped, instance, args, kwargs):
    release_graphs()
    group = args[0] if args else kwargs.get("group")
    comm.release_ring_comms(group)  # ours first, newest first (None: every ring's)
    return wrapped(*args, **kwargs)


def _build(patches: PatchSet) -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original = c10d.destroy_process_group
    handle = patches.wrapper(
        "torch.destroy_process_group", c10d, "destroy_process_group", _destroy_process_group
    )
    patches.rebind("torch.destroy_process_group", dist, "destroy_process_group", original, handle)


def ensure_applied() -> None:
    """Idempotent; called before a ring's first communicators and the first graph capture."""
    PATCHES.apply(_build)


def revert() -> None:
    release_graphs()  # the unpatched destroy_process_group would hang on them
    PATCHES.revert()
