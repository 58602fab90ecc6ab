"""The torch patch that frees tokenring_xdit's CUDA graphs before a process group is destroyed
(a graph holding NCCL kernels makes destroy_process_group hang: pytorch/pytorch#115388).

Run in a fresh interpreter with a real one-rank gloo group: the patch is applied (as the first
graph capture does), destroy_process_group frees the graphs then destroys the group, and
uninstall() gives torch back its own function under both names.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

CODE = textwrap.dedent(
    """
    import json, os, tempfile
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    import tokenring_xdit
    from tokenring_xdit.patches import torch_dist
    from tokenring_xdit.ring import graphs

    original = c10d.destroy_process_group
    init = os.path.join(tempfile.mkdtemp(), "rdv")
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=0, world_size=1)
    torch_dist.ensure_applied()
    torch_dist.ensure_applied()  # idempotent
    names = (dist.destroy_process_group, c10d.destroy_process_group)
    wrapped = all(f is not original for f in names)
    applied = tokenring_xdit.installed_patches()
    graphs.RING_GRAPHS._graphs["sentinel"] = None  # stands for a captured graph
    dist.destroy_process_group()
    report = dict(
        wrapped=wrapped,
        applied=applied,
        graphs_freed=len(graphs.RING_GRAPHS) == 0,
        destroyed=not dist.is_initialized(),
    )
    tokenring_xdit.uninstall()
    report["restored"] = (
        dist.destroy_process_group is original and c10d.destroy_process_group is original
    )
    report["after_uninstall"] = tokenring_xdit.installed_patches()
    print(json.dumps(report))
    """
)


def test_destroy_process_group_frees_graphs_and_uninstall_restores_it() -> None:
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == dict(
        wrapped=True,
        applied=["torch.destroy_process_group"],
        graphs_freed=True,
        destroyed=True,
        restored=True,
        after_uninstall=[],
    ), report


GUARD_CODE = textwrap.dedent(
    """
    import json, os, sys, tempfile
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    original = c10d.destroy_process_group
    from tokenring_xdit.ring import graphs  # the ring alone: nothing of the patch layer
    from tokenring_xdit.ring.comm import groups, teardown
    init = os.path.join(tempfile.mkdtemp(), "rdv")
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=0, world_size=1)
    before = c10d.destroy_process_group is original
    groups.comms_of(dist.group.WORLD)  # what a ring's first call does
    guarded = original not in (c10d.destroy_process_group, dist.destroy_process_group)
    graphs.RING_GRAPHS._graphs["sentinel"] = None  # stands for a captured graph
    dist.destroy_process_group()
    print(json.dumps(dict(
        before=before, guarded=guarded, graphs_freed=len(graphs.RING_GRAPHS) == 0,
        comms_released=len(teardown._COMMS) == 0, destroyed=not dist.is_initialized(),
        patch_layer="tokenring_xdit.patches" in sys.modules,
    )))
    """
)


def test_the_destroy_guard_is_the_rings_own():
    """The ring puts its teardown guard in place itself before it makes a ring's communicators
    (ring/comm/teardown.py), without the patch layer: a checkout on PYTHONPATH without install
    metadata gets it too (ring_sweep.py once hung in destroy), and a destroy frees our
    graphs and communicators first."""
    done = subprocess.run(
        [sys.executable, "-c", GUARD_CODE], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == dict(
        before=True,
        guarded=True,
        graphs_freed=True,
        comms_released=True,
        destroyed=True,
        patch_layer=False,
    ), report
