"""The agreed ring of one call: the handle every loop takes.

`agree()` (ring/agree/) returns one `Ring` per call, equal on every rank except its rank and
its communicators' handles. The loops read rank, size and `lanes()` of it; `finished()` bounds
what a call queued by the ring's deadline. How the lanes move data is the agreed transport,
looked up by name in `TRANSPORTS`. A packed call's ring carries its plan (a `BlockPlan`, made
by ring/packed/ from the agreed split and documents: the loops never see documents).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from .comm import RingComms, RingPosition, torch_lanes
from .comm.ipc import ipc_finished, ipc_lanes
from .comm.step_marks import capture_marks, replay_marks
from .comm.watchdog import watch
from .graph_cache import run_graphed
from .schedules.blocks import BlockStep
from .segments import Segment

__all__ = ["Ring", "BlockPlan", "TRANSPORTS"]


def _torch_finished(comms: RingComms, what: str) -> None:
    # gloo waits are bounded where they block; NCCL work is watched (a replay is watched instead)
    if comms.backend != "gloo" and not torch.cuda.is_current_stream_capturing():
        watch(comms, what)


# agreed transport name -> (lanes(comms, rank), finished(comms, what))
TRANSPORTS: dict[str, tuple[Callable, Callable]] = {
    "nccl": (torch_lanes, _torch_finished),
    "ipc": (ipc_lanes, ipc_finished),
}


class BlockPlan(Protocol):
    """What the loops need of a packed call's plan (ring/packed/ `DocPlan`): each rank's rows
    (of `schedule`), a step's segments, which transfers run, what a graph of it bakes in."""

    steps: tuple[tuple[BlockStep, ...], ...]
    schedule: Any
    packing: Hashable

    def block(self, rank: int, step: int) -> tuple[Segment, ...]: ...

    def transfers(self, rank: int) -> tuple[tuple[bool, bool, bool], ...]: ...


@dataclass(frozen=True, eq=False, kw_only=True)
class Ring:
    """The agreed ring of one call: equal on every rank except `rank` and `comms`' handles."""

    pos: RingPosition
    comms: RingComms | None  # None for a ring of one
    q_lens: tuple[int, ...]  # every ring rank's local query length
    settings: tuple[int, ...]  # the agreed header slots (every rank's are equal)
    transport: str = "nccl"  # how the lanes move data: a name in TRANSPORTS
    plan: BlockPlan | None = None  # a packed call's plan (agreed split and documents)
    swapped: bool = False  # Q and partials travel with seq and heads swapped (layout.storage)
    kv_lens: tuple[int, ...] = ()  # a training call's: every rank's local K/V length

    @property
    def rank(self) -> int:
        return self.pos.rank

    @property
    def size(self) -> int:
        return self.pos.size

    @property
    def key(self) -> tuple:
        """The agreed value, for caches (no rank-local fact in it)."""
        return (self.q_lens, self.kv_lens, self.settings, self.swapped)

    def lanes(self):
        """(Q lane, return lane) for one call."""
        return TRANSPORTS[self.transport][0](self.comms, self.pos.rank)

    def graph_key(self, baked: tuple, inputs: tuple[torch.Tensor, ...]) -> tuple:
        """A ring call's graph cache key: this ring's agreed value, what the call bakes into its
        graph (`baked`) and the inputs' signature (shape, strides, dtype), so ranks that agreed
        the call ask the cache for the same keys in the same order."""
        signature = tuple((x.shape, x.stride(), x.dtype) for x in inputs)
        return (self.pos.group, self.key, *baked, signature)

    def graphed(
        self, key: Hashable, inputs: tuple[torch.Tensor, ...], run: Callable,
        packing: Hashable = None,
    ) -> Any:  # fmt: skip
        """`run(inputs)` through the ring call graphs under `key` (agreed on every rank): the
        first call of a key runs eagerly, then it is captured and replayed. `packing`: a packed
        call's agreed documents (graphs.run_graphed keeps the last few packings'). With the replay
        step marks on, a replay's steps are named by the events its capture recorded
        (comm/step_marks.py); off (the default), nothing is added to a replay."""
        comms = self.comms
        if comms is None or not comms.settings.replay_step_marks:
            return run_graphed(key, inputs, run, self.pos.group, packing)
        ran = []

        def marked(xs):
            ran.append(True)
            with capture_marks(comms, key):
                return run(xs)

        result = run_graphed(key, inputs, marked, self.pos.group, packing)
        if not ran:
            replay_marks(comms, key)
        return result

    def finished(self, what: str) -> None:
        """Bound the work this call queued by the ring's deadline (never blocks the host on
        NCCL; gloo waits are bounded where they block; IPC: the host waits, bounded)."""
        if self.comms is not None:
            TRANSPORTS[self.transport][1](self.comms, what)
