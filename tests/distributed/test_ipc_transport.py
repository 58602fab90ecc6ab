"""The IPC transport on CPU-only ranks (real gloo ranks): it refuses on every rank, naming the
fix, instead of failing on one."""

from __future__ import annotations

import pytest

from tests.harness import run_ranks


def _refuses(rank, n):
    """On a CPU-only ring the IPC lanes refuse on every rank, naming the fix."""
    import torch.distributed as dist

    from tokenring_xdit.ring.comm import RingPosition
    from tokenring_xdit.ring.comm_ipc.lanes import ipc_lanes

    try:
        ipc_lanes(RingPosition.of(dist.group.WORLD))
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_a_ring_that_cannot_use_ipc_refuses_on_every_rank():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine could run the IPC transport")
    for r in run_ranks(_refuses, 2, timeout=60):
        assert r.ok, r.trace
        assert "TOKENRING_XDIT_TRANSPORT=nccl" in r.value and "ring rank 0" in r.value, r.value
        assert "ring rank 1" in r.value, r.value
