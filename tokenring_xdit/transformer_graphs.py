"""Replay a DiT transformer's whole forward as one CUDA graph per input signature.

Why: at 1024 px on 2 x H200 a PixArt-alpha step under xDiT is ~23 ms of GPU work behind ~55 ms
of host work (~1000 kernel launches per step from diffusers' and xDiT's Python), so the GPUs idle
about half the time (profile in docs/performance.md). Replaying one graph per step removes that
host cost. TokenRing calls inside the capture are captured with it (its per-call graphs step
aside while a capture is running), NCCL kernels included.

What makes replay safe:
- the key holds every tensor argument's shape, dtype and device type, every other argument's value
  and the selected xDiT ring: a new resolution, batch or ring captures a new graph;
- the first call of a key runs eagerly (it warms NCCL, cuDNN plans and TokenRing's handshake);
  the capture follows it, and every rank agrees on the key and on success, or all stay eager;
- Python state read inside forward must not change between calls with equal keys. xDiT's
  runtime state (patch sizes) does not when PipeFusion and step caches are off, which the xDiT
  hook checks;
- weights are read where they live: in-place updates are seen, reassigned tensors are not
  (call `reset_graphs` after e.g. swapping weights or moving the module to another GPU);
- outputs are cloned out of the graph's buffers, so callers may keep them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_flatten, tree_unflatten

from .ring.graphs import all_ranks_ok

GRAPH_TRANSFORMER_ENV = "TOKENRING_XDIT_CUDA_GRAPH_TRANSFORMER"
MAX_GRAPHS = 8  # per module; more keys than this means arguments change per call: stay eager

log = logging.getLogger("xfuser.tokenring_xdit")
_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device)


def graph_transformer_requested() -> bool:
    return os.environ.get(GRAPH_TRANSFORMER_ENV, "0").lower() in ("1", "true", "yes", "on")


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: list[Any]  # flattened (args, kwargs); tensors are the static input buffers
    outputs: list[Any]
    out_spec: Any


@dataclass
class GraphStats:
    captures: int = 0
    replays: int = 0
    eager: int = 0
    refused: list[str] = field(default_factory=list)


class GraphedForward:
    """Callable standing in for `module.forward`; see the module docstring for the rules."""

    def __init__(
        self,
        forward: Callable,
        group: dist.ProcessGroup | None = None,
        extra_key: Callable[[], Hashable] | None = None,
    ) -> None:
        self.eager_forward = forward
        self.group = group
        self.extra_key = extra_key
        self.stats = GraphStats()
        self._graphs: dict[Hashable, _Graph | None] = {}  # None: stay eager for this key
        self._pool = None
        self.replaced: Any = None  # set by graph_transformer: the instance forward it replaced
        _LIVE.add(self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, spec = tree_flatten((args, kwargs))
        key = self._key(leaves, spec)
        entry = self._graphs.get(key, _MISSING) if key is not None else None
        if entry is _MISSING:
            result = self.eager_forward(*args, **kwargs)  # warm-up, and this call's answer
            self._graphs[key] = self._capture(leaves, spec, key)
            return result
        if entry is None:
            self.stats.eager += 1
            return self.eager_forward(*args, **kwargs)
        for static, x in zip(entry.inputs, leaves, strict=True):
            if isinstance(static, torch.Tensor):
                static.copy_(x)
        entry.graph.replay()
        self.stats.replays += 1
        outs = [x.clone() if isinstance(x, torch.Tensor) else x for x in entry.outputs]
        return tree_unflatten(outs, entry.out_spec)

    def reset(self) -> None:
        """Drop every graph (their memory too); the next call of each key captures again."""
        self._graphs.clear()
        self._pool = None

    def _key(self, leaves: list[Any], spec: Any) -> Hashable | None:
        if torch.is_grad_enabled() or not torch.cuda.is_available():
            return None
        if torch.cuda.is_current_stream_capturing():
            return None  # inside someone else's capture: just be captured
        parts: list[Hashable] = [str(spec), self.extra_key() if self.extra_key else None]
        on_cuda = False
        for x in leaves:
            if isinstance(x, torch.Tensor):
                if x.device.type != "cuda" or x.requires_grad:
                    return None  # a CPU tensor's values would be baked into the graph
                on_cuda = True
                # device type only: the key must be equal on every rank (cuda:0 vs cuda:1)
                parts.append((tuple(x.shape), x.dtype, x.device.type))
            elif isinstance(x, _PLAIN):
                parts.append((type(x).__name__, x))
            else:
                return None  # an object whose state we cannot see
        if not on_cuda:
            return None
        if len(self._graphs) >= MAX_GRAPHS:
            key = tuple(parts)
            return key if key in self._graphs else None
        return tuple(parts)

    def _capture(self, leaves: list[Any], spec: Any, key: Hashable) -> _Graph | None:
        static = [x.clone() if isinstance(x, torch.Tensor) else x for x in leaves]
        device = next(x.device for x in static if isinstance(x, torch.Tensor))
        same_key = _agree_on_key(key, device, self.group)
        graph, outputs, error = torch.cuda.CUDAGraph(), None, None
        if same_key:
            from .patches import torch_dist

            torch_dist.ensure_applied()  # free graphs before NCCL teardown, or it hangs
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            torch.cuda.synchronize(device)
            try:
                args, kwargs = tree_unflatten(static, spec)
                with torch.cuda.graph(graph, pool=self._pool):
                    outputs = self.eager_forward(*args, **kwargs)
            except Exception as exc:  # a host sync or an uncapturable op: stay eager
                error = f"{type(exc).__name__}: {exc}"
        ok = same_key and error is None
        if not all_ranks_ok(ok, device, self.group):
            reason = error or ("ranks called with different arguments" if not same_key else None)
            reason = reason or "capture failed on another rank"
            self.stats.refused.append(reason)
            log.warning("transformer CUDA graph not used for this input signature: %s", reason)
            return None
        self.stats.captures += 1
        out_leaves, out_spec = tree_flatten(outputs)
        return _Graph(graph, static, out_leaves, out_spec)


_MISSING = object()
_LIVE: weakref.WeakSet[GraphedForward] = weakref.WeakSet()


def reset_all_graphs() -> None:
    """Free the graphs of every graphed forward in this process (before NCCL teardown)."""
    for graphed in list(_LIVE):
        graphed.reset()


def _digest(key: Hashable) -> int:
    return int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:7], "little")


def _agree_on_key(key: Hashable, device: torch.device, group) -> bool:
    if not dist.is_initialized():
        return True
    d = _digest(key)
    both = torch.tensor([d, -d], device=device, dtype=torch.int64)
    dist.all_reduce(both, op=dist.ReduceOp.MIN, group=group)
    return both[0].item() == d and -both[1].item() == d


def _current_xdit_ring() -> str:
    from .selection import xdit_ring_impl

    return xdit_ring_impl()[0]


def graph_transformer(module: torch.nn.Module, group: dist.ProcessGroup | None = None) -> bool:
    """Make `module` replay its forward as CUDA graphs (see the module docstring).

    Every rank that runs the module must call this (the capture is agreed over `group`, default
    the world). Returns False if it already was graphed. Undo with `ungraph_transformer`.
    """
    if isinstance(module.__dict__.get("forward"), GraphedForward):
        return False
    graphed = GraphedForward(module.forward, group, extra_key=_current_xdit_ring)
    graphed.replaced = module.__dict__.get("forward", _MISSING)  # e.g. xDiT's compiled forward
    module.forward = graphed
    return True


def ungraph_transformer(module: torch.nn.Module) -> bool:
    """Restore the module's previous forward (and free its graphs); False if it was not graphed."""
    graphed = module.__dict__.get("forward")
    if not isinstance(graphed, GraphedForward):
        return False
    graphed.reset()
    if graphed.replaced is _MISSING:
        del module.forward  # back to the class's own forward
    else:
        module.forward = graphed.replaced
    return True


def graph_stats(module: torch.nn.Module) -> GraphStats | None:
    graphed = module.__dict__.get("forward")
    return graphed.stats if isinstance(graphed, GraphedForward) else None


def reset_graphs(module: torch.nn.Module) -> None:
    graphed = module.__dict__.get("forward")
    if isinstance(graphed, GraphedForward):
        graphed.reset()
