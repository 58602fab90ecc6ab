"""Where a ring call stopped: the step a deadline's error names, eager or CUDA-graph replay.

An eager NCCL call keeps each lane wait's own work handle (lanes.py): the first one not
completed when the deadline passes is the step that stalled. A graph replay runs every step
without the host, so there is no handle per step. Instead, while a ring call is captured, each
lane wait also records an external CUDA event (a record node of the graph: every replay records
it again when the step's transfers are done). The graph's key keeps those events with the steps
they follow; a replay hands them to the deadline's check as that call's marks, and the first
event a stuck replay has not reached names its step. Cost: one event record node per lane wait
in the graph, no host work per replay; measured 3-20 % on graphed calls at ring 4 (H200), so
off unless `TOKENRING_XDIT_REPLAY_STEP_MARKS=1` (the error then names the peers only).

A mark is (handle, (lane, what, step, send peers, receive peers)); a handle has
`is_completed()` (an NCCL work, or `Reached` around a captured event).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from .groups import RingComms, describe_peer

__all__ = ["Reached", "capture_marks", "mark_captured_step", "replay_marks", "stalled_step"]

# graph keys kept per ring (the graph cache keeps at most 64 graphs; keys beyond twice that
# belong to graphs it has dropped)
_KEYS_KEPT = 128


class Reached:
    """A captured step's event, read as a work handle: completed once the replay got past it."""

    __slots__ = ("event",)

    def __init__(self, event: torch.cuda.Event):
        self.event = event

    def is_completed(self) -> bool:
        return self.event.query()


def mark_captured_step(comms: RingComms, lane: str, about: tuple) -> None:
    """Inside a capture of a ring call (`capture_marks`): mark the end of a lane wait."""
    if comms.captured is None:
        return  # captured inside someone else's graph (a whole transformer): not named
    event = torch.cuda.Event(external=True)  # a record node every replay runs again
    event.record()
    comms.captured.append((Reached(event), (lane,) + tuple(about)))


@contextmanager
def capture_marks(comms: RingComms | None, key: Hashable) -> Iterator[None]:
    """Around one ring call whose ring keeps replay step marks (`Ring.graphed` asks only
    then): if it is being captured, keep its step marks under `key`."""
    wanted = comms is not None and comms.backend != "gloo"
    if not (wanted and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
        yield
        return
    comms.captured = []
    try:
        yield
        kept = comms.graph_marks
        kept.pop(key, None)
        kept[key] = comms.captured
        while len(kept) > _KEYS_KEPT:
            del kept[next(iter(kept))]
    finally:
        comms.captured = None


def replay_marks(comms: RingComms | None, key: Hashable) -> None:
    """A replay of the graph under `key` ran: its captured marks are this call's marks."""
    if comms is not None:
        comms.marks = list(comms.graph_marks.get(key, ()))


def stalled_step(comms: RingComms, marks: list) -> str:
    """Where the call stopped, as a clause for the error: its first step whose transfers never
    completed and the peers of that step; for a replay without marks, the peers it talks to."""
    for work, (lane, _, step, sends, recvs) in marks:
        if not work.is_completed():
            peers = [f"send to {describe_peer(comms, p)}" for p in dict.fromkeys(sends)]
            peers += [f"receive from {describe_peer(comms, p)}" for p in dict.fromkeys(recvs)]
            where = " of a CUDA-graph replay" if isinstance(work, Reached) else ""
            return f", stopped at step {step} on the {lane} lane{where} ({', '.join(peers)})"
    if marks:
        return ""
    me = comms.ranks.index(dist.get_rank()) if dist.is_initialized() else 0
    peers = sorted({(me + d) % len(comms.ranks) for d in (-1, 1)})
    return (
        ", in a CUDA-graph replay (its steps are not observed one by one; its transfers go "
        f"to and come from {' and '.join(describe_peer(comms, p) for p in peers)})"
    )
