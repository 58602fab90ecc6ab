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
  (call `module.forward.reset()` after e.g. swapping weights or moving the module to another
  GPU);
- outputs are cloned out of the graph's buffers, so callers may keep them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_flatten, tree_unflatten

from .. import config
from ..ring.graph_cache import GraphCache, GraphStats, release_all_graphs

GRAPH_TRANSFORMER_ENV = config.ENV["cuda_graph_transformer"][0]
MAX_GRAPHS = 8  # per module; more keys than this means arguments change per call: stay eager

log = logging.getLogger("xfuser.tokenring_xdit")
_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device)


def graph_transformer_requested() -> bool:
    """Asked for, and not under expandable segments with NCCL's graph registration on (its
    graphed NCCL transfers hang: config.graph_register_hazard)."""
    cfg = config.current()
    if cfg.cuda_graph_transformer and cfg.graph_register_hazard:
        log.warning(
            "%s is ignored: expandable segments with NCCL_GRAPH_REGISTER unset hang graphed NCCL "
            "transfers (pytorch/pytorch#158029); set NCCL_GRAPH_REGISTER=0 to use it",
            GRAPH_TRANSFORMER_ENV,
        )
        return False
    return cfg.cuda_graph_transformer


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
        # the key is built from Python state, so every rank compares it before a capture
        self.graphs = GraphCache(max_entries=MAX_GRAPHS, agree_on_key=True)
        self.replaced: Any = None  # set by graph_transformer: the instance forward it replaced

    @property
    def stats(self) -> GraphStats:
        return self.graphs.stats

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, spec = tree_flatten((args, kwargs))
        key = self._key(leaves, spec)
        if key is None:
            self.stats.eager += 1
            return self.eager_forward(*args, **kwargs)
        refused = len(self.stats.refused)
        result = self.graphs(key, leaves, lambda xs: self._forward(xs, spec), self.group)
        if len(self.stats.refused) > refused:
            log.warning(
                "transformer CUDA graph not used for this input signature: %s",
                self.stats.refused[-1],
            )
        return result

    def _forward(self, leaves: list[Any], spec: Any) -> Any:
        args, kwargs = tree_unflatten(leaves, spec)
        return self.eager_forward(*args, **kwargs)

    def reset(self) -> None:
        """Drop every graph (their memory too); the next call of each key captures again."""
        self.graphs.clear()

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
        return tuple(parts) if on_cuda else None


_MISSING = object()


def reset_all_graphs() -> None:
    """Free every graph in this process, transformer and TokenRing calls (before NCCL teardown)."""
    release_all_graphs()


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
