"""One CUDA-graph capture/replay cache, for TokenRing calls and for whole transformer forwards.

At DiT shapes one ring call is ~0.1-0.5 ms of GPU work but ~20 kernel launches and a few NCCL
batches of host work, paid per layer per step (and a 1024 px transformer step is ~1000
launches). A signature is run eagerly once (NCCL communicators, cuDNN plans and the input
handshake warm up), then captured once, then replayed: tensor inputs are copied into the graph's
static buffers and tensor outputs cloned out of it, so callers may keep them. Every rank of the
group agrees on the capture (all keep a graph or none does), so ranks never diverge.
"""

from __future__ import annotations

import hashlib
import threading
import traceback
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_flatten, tree_unflatten

from .comm.teardown import drop_graphs, ensure_guard, holds_graphs

__all__ = [
    "PACKINGS_KEPT",
    "GraphCache",
    "GraphStats",
    "PackingWindow",
    "all_ranks_ok",
    "clear_graphs",
    "graphs_wanted",
    "keep_alive",
    "release_all_graphs",
    "run_graphed",
]

# TokenRing call graphs kept at most (least recently used dropped first): a growing KV cache
# makes a new signature per length, and each graph holds its buffers.
RING_GRAPH_LIMIT = 64
# Packed-document graphs kept per ring: those of its last PACKINGS_KEPT packings (in the order
# first seen). A batch's packing is new almost every step and each of its graphs holds static
# buffers of the call's size, so older ones are dead weight; two, not one, so a forward that runs
# ahead of the previous batch's backward (pipeline schedules, an evaluation batch in between)
# does not drop graphs that are still to be replayed.
PACKINGS_KEPT = 2


@dataclass
class GraphStats:
    captures: int = 0
    replays: int = 0
    eager: int = 0
    dropped: int = 0  # graphs dropped by `GraphCache.drop` (old packings)
    refused: list[str] = field(default_factory=list)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: list[Any]  # flattened inputs; tensors are the static input buffers
    outputs: list[Any]
    out_spec: Any  # None: the outputs were a plain tuple of tensors (a ring call's (out, lse))
    kept: list[torch.Tensor] = field(default_factory=list)  # read by the graph, made outside it


_MISSING = object()
_CAPTURING = threading.local()  # .kept: the list of the capture under way on this thread


def keep_alive(*tensors: torch.Tensor) -> None:
    """Tensors that the capture under way (on this thread) reads but that a cache outside it
    owns (e.g. device offsets cached by value): the graph keeps them until it is dropped, so a
    cache that lets them go cannot free memory a replay still reads. No capture: nothing."""
    kept = getattr(_CAPTURING, "kept", None)
    if kept is not None:
        kept.extend(tensors)


class GraphCache:
    """Graphs keyed by call signature. `run(leaves)` must be a pure function of its flattened
    inputs (tensors and plain values) that is capturable; `key` must be equal on every rank.

    max_entries: past it, new keys run eagerly (their arguments probably change per call).
    lru: past it, the least recently used graph of the same group is dropped (with its memory)
    for a new key; a group's key sequence is agreed across its ranks, so every rank drops the
    same one. Counted per group, not over the cache: with a count over every group, a rank whose
    other rings made more keys would drop a graph its peers in this ring keep, and the next call
    would capture (a collective) on one rank and replay on the other: a hang.
    agree_on_key: compare the key across the group before capturing (a caller whose key can
    differ between ranks, e.g. built from Python state).
    """

    def __init__(
        self, max_entries: int | None = None, agree_on_key: bool = False, lru: int | None = None
    ) -> None:
        self.max_entries = max_entries
        self.lru = lru
        self.agree_on_key = agree_on_key
        self.stats = GraphStats()
        self._graphs: dict[Hashable, _Graph | None] = {}  # None: stay eager for this key
        self._group: dict[Hashable, Any] = {}  # key -> the group it was made in (lru)
        self._pool = None
        self._lock = threading.Lock()

    def __call__(
        self, key: Hashable, leaves: Sequence[Any], run: Callable[[Sequence[Any]], Any], group
    ) -> Any:
        with self._lock:  # a ring's deadline may drop every graph from its watchdog thread
            entry = self._graphs.get(key, _MISSING)
            if entry is _MISSING and self.max_entries is not None:
                if len(self._graphs) >= self.max_entries:
                    entry = None
            if entry is not _MISSING and self.lru is not None:
                self._graphs[key] = self._graphs.pop(key)  # most recently used last
        if entry is _MISSING:
            result = run(leaves)  # warm-up, and this call's answer
            with self._lock:
                if self.lru is not None:
                    mine = [k for k in self._graphs if self._group.get(k) is group]
                    if len(mine) >= self.lru:  # the group's least recently used
                        del self._graphs[mine[0]]
                        self._group.pop(mine[0], None)
            graph = self._capture(key, leaves, run, group)
            with self._lock:
                self._graphs[key] = graph
                self._group[key] = group
            return result
        if entry is None:
            self.stats.eager += 1
            return run(leaves)
        for static, x in zip(entry.inputs, leaves, strict=True):
            if isinstance(static, torch.Tensor):
                static.copy_(x)
        entry.graph.replay()
        self.stats.replays += 1
        if entry.out_spec is None:  # the per-call ring path: no pytree work on every replay
            return tuple(x.clone() for x in entry.outputs)
        outs = [x.clone() if isinstance(x, torch.Tensor) else x for x in entry.outputs]
        return tree_unflatten(outs, entry.out_spec)

    def drop(self, keys: Iterable[Hashable]) -> int:
        """Drop the graphs of `keys` (absent ones are skipped; their memory goes back to the
        pool for later captures); the next call of such a key captures again. Returns how many
        graphs were dropped."""
        with self._lock:
            gone = []
            for key in keys:
                self._group.pop(key, None)
                gone.append(self._graphs.pop(key, None))
        dropped = sum(isinstance(g, _Graph) for g in gone)
        self.stats.dropped += dropped
        return dropped

    def clear(self) -> None:
        """Drop every graph (their memory too); the next call of each key captures again."""
        with self._lock:
            self._graphs.clear()
            self._group.clear()
            self._pool = None

    def __len__(self) -> int:
        return len(self._graphs)

    def _capture(self, key: Hashable, leaves: list[Any], run, group) -> _Graph | None:
        static = [x.clone() if isinstance(x, torch.Tensor) else x for x in leaves]
        device = next(x.device for x in static if isinstance(x, torch.Tensor))
        same_key = not self.agree_on_key or _agree_on_key(key, device, group)
        graph, outputs, error, kept = torch.cuda.CUDAGraph(), None, None, []
        if same_key:
            ensure_guard()  # destroy_process_group frees our graphs first (pytorch#115388)
            holds_graphs(self)  # ... these among them (and the exit hook, and an abort)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            torch.cuda.synchronize(device)
            _CAPTURING.kept = kept
            try:
                with torch.cuda.graph(graph, pool=self._pool):
                    outputs = run(static)
            except Exception as exc:  # a host sync or an uncapturable op: stay eager
                error = _first_error(exc)
                _reset_rng_capture(device)
            finally:
                _CAPTURING.kept = None
        if not all_ranks_ok(same_key and error is None, device, group):
            reason = error or ("ranks called with different arguments" if not same_key else None)
            self.stats.refused.append(reason or "capture failed on another rank")
            return None
        self.stats.captures += 1
        if type(outputs) is tuple and all(isinstance(x, torch.Tensor) for x in outputs):
            return _Graph(graph, static, list(outputs), None, kept)
        out_leaves, out_spec = tree_flatten(outputs)
        return _Graph(graph, static, out_leaves, out_spec, kept)


def _first_error(exc: BaseException) -> str:
    """What broke a capture, and where. When the op that broke it raised, torch's capture_end
    (leaving the `with torch.cuda.graph`) raises its own "previous error during capture" on top:
    report the op's error instead, with its innermost frame outside torch."""
    frames = traceback.extract_tb(exc.__traceback__)
    while exc.__context__ is not None and frames and _in_graph_exit(frames[-1]):
        exc = exc.__context__
        frames = traceback.extract_tb(exc.__traceback__)
    outside = [f for f in frames if "/torch/" not in f.filename] or frames
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if not outside:
        return f"{type(exc).__name__}: {text}"
    frame = outside[-1]
    return f"{type(exc).__name__}: {text} (in {frame.name}, {frame.filename}:{frame.lineno})"


def _in_graph_exit(frame: traceback.FrameSummary) -> bool:
    return frame.filename.replace("\\", "/").endswith("torch/cuda/graphs.py")


def _reset_rng_capture(device: torch.device) -> None:
    """After a capture that failed: a capture that ends in an error (cudaStreamEndCapture
    raises) never runs the epilogue of the CUDA generators it registered, so the default
    generator stays "capturing" and the next torch.randn outside a capture raises "Offset
    increment outside graph capture encountered unexpectedly" (seen in a diffusers scheduler
    step). A capture that succeeds runs the prologue and the epilogue of the default generator
    again; one tiny graph, dropped at once, puts it back."""
    try:
        with torch.cuda.device(device):
            torch.cuda.synchronize()
            scratch = torch.zeros(1, device=device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                scratch.add_(1)
            del graph
    except RuntimeError:  # the device itself is broken: the caller's next step will say so
        pass


def _digest(key: Hashable) -> int:
    return int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:7], "little")


def _flag_device(device: torch.device, group) -> torch.device:
    """Where a capture's agreement flag lives: a gloo group (a same-GPU ring over IPC) moves
    CPU tensors."""
    return torch.device("cpu") if dist.get_backend(group) == "gloo" else device


def _agree_on_key(key: Hashable, device: torch.device, group) -> bool:
    if not dist.is_initialized():
        return True
    d = _digest(key)
    both = torch.tensor([d, -d], device=_flag_device(device, group), dtype=torch.int64)
    dist.all_reduce(both, op=dist.ReduceOp.MIN, group=group)
    return both[0].item() == d and -both[1].item() == d


def all_ranks_ok(ok: bool, device: torch.device, group: dist.ProcessGroup | None) -> bool:
    """True only if `ok` on every rank of `group` (a capture is used by all ranks or none)."""
    if not dist.is_initialized():
        return ok
    flag = torch.tensor([int(ok)], device=_flag_device(device, group))
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def graphs_wanted(enabled: bool, device: torch.device) -> bool:
    """Whether a ring call on `device` should go through the graph cache."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return False  # inside someone else's capture, just be captured
    return enabled


class PackingWindow:
    """Which packed-document graphs a cache keeps: per ring, the keys of its last `kept`
    packings in the order first seen. `admit` is told every graphed packed call; a ring's
    packed calls come in the same order on each of its ranks (the keys are agreed), so every
    rank drops the same graphs at the same call. Bookkeeping only: the cache drops them."""

    def __init__(self, kept: int) -> None:
        self.kept = kept
        self._rings: dict[Hashable, dict[Hashable, set[Hashable]]] = {}

    def admit(self, ring: Hashable, packing: Hashable, key: Hashable) -> list[Hashable]:
        """Record `key` as a graph of `packing` on `ring`; returns the keys of the packings
        that fall out of the window (a new packing pushes the oldest out)."""
        packings = self._rings.setdefault(ring, {})
        packings.setdefault(packing, set()).add(key)
        dropped: list[Hashable] = []
        while len(packings) > self.kept:
            dropped.extend(packings.pop(next(iter(packings))))
        return dropped

    def clear(self) -> None:
        self._rings.clear()


# TokenRing calls share one cache (keys hold the group, rank, kernel and tensor signature).
RING_GRAPHS = GraphCache(lru=RING_GRAPH_LIMIT)
RING_PACKINGS = PackingWindow(PACKINGS_KEPT)


def run_graphed(
    key: Hashable, inputs: tuple[torch.Tensor, ...], run, group, packing: Hashable = None
) -> Any:
    """run(inputs) through the ring's graph cache under `key` (same key on every ring rank).
    `packing`: the call's agreed packed documents (its graphs are kept for the ring's last
    PACKINGS_KEPT packings only)."""
    if packing is not None:
        RING_GRAPHS.drop(RING_PACKINGS.admit(group, packing, key))
    return RING_GRAPHS(key, inputs, run, group)


def clear_graphs() -> None:
    """Drop the TokenRing call graphs (frees their memory)."""
    RING_GRAPHS.clear()
    RING_PACKINGS.clear()


release_all_graphs = drop_graphs  # every graph of every cache; returns how many caches held any
