"""No TokenRing call blocks the host on the GPU once warm (2 GPUs, NCCL): a host wait inside a
ring call sits behind the ring's transfers, out of reach of the deadline's watch, so a peer
that dies there would hold the survivor forever (the packed path's cu_seqlens copy
did, measured on 2 x H200). benchmarks/diagnostics/host_sync.py runs each path under
`torch.cuda.set_sync_debug_mode("error")`."""

from __future__ import annotations

import json

import pytest
import torch

from tests.harness import torchrun_script

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]


@pytest.mark.timeout(600)
def test_no_path_blocks_the_host(tmp_path):
    out = tmp_path / "host_sync.json"
    run = torchrun_script("benchmarks/diagnostics/host_sync.py", "--out", str(out), timeout=500)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert results == {p: "ok" for p in results} and len(results) == 4, results
