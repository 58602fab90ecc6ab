"""The transport setting on CPU-only gloo ranks (real ranks): `ipc` refuses on every rank with
the fix (CPU tensors, and no CUDA / cuda-bindings for the lanes themselves); `auto` keeps CPU
tensors on the gloo lanes and stays exact."""

from __future__ import annotations

import pytest
import torch

from tests.harness import run_ranks


def _transport_on_cpu(rank, n):
    import os

    import torch.distributed as dist

    from tokenring_xdit.ring import token_ring_attn
    from tokenring_xdit.ring.comm import comms_of
    from tokenring_xdit.ring.comm.ipc import ipc_lanes

    found = {}
    gen = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(1, 5 + rank, 2, 16, generator=gen) for _ in "qkv")
    for transport in ("ipc", "auto"):
        os.environ["TOKENRING_XDIT_TRANSPORT"] = transport
        try:
            out, _ = token_ring_attn(q, k, v)
            outs = [None] * n
            dist.all_gather_object(outs, (q, k, v, out))
            gq = torch.cat([o[0] for o in outs], 1).transpose(1, 2).double()
            gk, gv = (torch.cat([o[i] for o in outs], 1).transpose(1, 2).double() for i in (1, 2))
            ref = torch.nn.functional.scaled_dot_product_attention(gq, gk, gv).transpose(1, 2)
            start = sum(5 + r for r in range(rank))
            err = (out.double() - ref[:, start : start + 5 + rank]).abs().max().item()
            found[transport] = ("ok", err)
        except (ValueError, NotImplementedError) as exc:
            found[transport] = (type(exc).__name__, str(exc))
    try:  # the lanes themselves, asked for directly: every rank raises the same error
        ipc_lanes(comms_of(dist.group.WORLD), rank)
        found["lanes"] = ("no error", "")
    except ValueError as exc:
        found["lanes"] = ("ValueError", str(exc))
    return found


def test_transport_setting_on_a_cpu_only_ring():
    if torch.cuda.is_available():
        pytest.skip("a CPU-only machine checks the refusal")
    for r in run_ranks(_transport_on_cpu, 2, timeout=90):
        assert r.ok, r.trace
        kind, text = r.value["ipc"]
        assert kind == "ValueError" and "cuda" in text and "not cpu" in text, text
        # the hint fixes what was asked (ipc with CPU tensors), not the opposite case
        assert "ipc moves CUDA tensors only" in text and "TRANSPORT=ipc or auto" not in text, text
        assert r.value["auto"][0] == "ok" and r.value["auto"][1] < 1e-5, r.value["auto"]
        kind, text = r.value["lanes"]
        assert kind == "ValueError" and "TOKENRING_XDIT_TRANSPORT=nccl" in text, text
        assert "ring rank 0" in text and "ring rank 1" in text, text
