"""Replay TokenRing forwards as CUDA graphs, to take the host out of small-shape calls.

At DiT shapes one ring call is ~0.1-0.5 ms of GPU work but ~20 kernel launches and a few NCCL
batches of host work, paid per layer per step. A forward for a given signature is run eagerly
once (NCCL communicators, cuDNN plans, the shape handshake all warm up), then captured once, then
replayed: inputs are copied into the graph's static buffers and outputs cloned out of it.
Capture is agreed across the ring (all keep a graph or none does), so ranks never diverge.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch
import torch.distributed as dist

GRAPH_ENV = "TOKENRING_XDIT_CUDA_GRAPHS"

Tensors = tuple[torch.Tensor, ...]


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    static_inputs: Tensors
    outputs: Tensors


_GRAPHS: dict[Hashable, _Captured | None] = {}  # None: capture failed somewhere, run eagerly
_POOL: list = []


def graphs_wanted(flag: bool | None, device: torch.device) -> bool:
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return False  # inside someone else's capture, just be captured
    if flag is not None:
        return flag
    return os.environ.get(GRAPH_ENV, "1").lower() not in ("0", "false", "no", "off")


def run_graphed(
    key: Hashable, inputs: Tensors, run: Callable[[Tensors], Tensors], group: dist.ProcessGroup
) -> Tensors:
    """run(inputs) through a CUDA graph cached under `key` (same key on every ring rank)."""
    entry = _GRAPHS.get(key, _MISSING)
    if entry is _MISSING:
        result = run(inputs)  # warm-up, also the answer for this call
        _GRAPHS[key] = _capture(inputs, run, group)
        return result
    if entry is None:
        return run(inputs)
    for static, x in zip(entry.static_inputs, inputs, strict=True):
        static.copy_(x)
    entry.graph.replay()
    return tuple(out.clone() for out in entry.outputs)


_MISSING = object()


def _capture(inputs: Tensors, run, group) -> _Captured | None:
    static = tuple(x.clone() for x in inputs)
    if not _POOL:
        _POOL.append(torch.cuda.graph_pool_handle())
    graph = torch.cuda.CUDAGraph()
    outputs, ok = None, True
    from ..patches import torch_dist

    torch_dist.ensure_applied()  # free graphs before NCCL teardown, or it hangs
    torch.cuda.synchronize()
    try:
        with torch.cuda.graph(graph, pool=_POOL[0]):
            outputs = run(static)
    except Exception:  # e.g. a kernel or backend that cannot be captured: stay eager
        ok = False
    if not all_ranks_ok(ok, static[0].device, group):
        return None
    return _Captured(graph, static, tuple(outputs))


def all_ranks_ok(ok: bool, device: torch.device, group: dist.ProcessGroup | None) -> bool:
    """True only if `ok` on every rank of `group` (a capture is used by all ranks or none)."""
    if not dist.is_initialized():
        return ok
    flag = torch.tensor([int(ok)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def clear_graphs() -> None:
    """Drop every captured graph (frees their memory; e.g. before destroying process groups)."""
    _GRAPHS.clear()
