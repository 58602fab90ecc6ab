"""The step a stuck call names (ring/comm/step_marks.py): eager work handles and a replay's
captured events are read alike; the first one not reached is the step."""

from __future__ import annotations

from types import SimpleNamespace

from tokenring_xdit.ring.comm.step_marks import (
    Reached,
    capture_marks,
    mark_captured_step,
    replay_marks,
    stalled_step,
)


class _Event:  # the one member of torch.cuda.Event the check reads
    def __init__(self, done: bool):
        self.done = done

    def query(self) -> bool:
        return self.done


class _Work:
    def __init__(self, done: bool):
        self.done = done

    def is_completed(self) -> bool:
        return self.done


def _comms():
    return SimpleNamespace(
        ranks=(4, 5, 6, 7),
        backend="nccl",
        settings=SimpleNamespace(replay_step_marks=True),
        marks=[],
        captured=None,
        graph_marks={},
    )


def test_a_replay_names_the_first_step_its_events_did_not_reach():
    comms = _comms()
    marks = [
        (Reached(_Event(True)), ("Q", "q", 0, [1], [3])),
        (Reached(_Event(False)), ("return", "partial", 1, [3], [1])),
        (Reached(_Event(False)), ("Q", "q", 2, [1], [3])),
    ]
    text = stalled_step(comms, marks)
    assert text.startswith(", stopped at step 1 on the return lane of a CUDA-graph replay")
    assert "send to ring rank 3 (global rank 7)" in text
    assert "receive from ring rank 1 (global rank 5)" in text


def test_an_eager_call_names_its_step_without_the_replay_words():
    comms = _comms()
    marks = [(_Work(True), ("Q", "q", 0, [1], [3])), (_Work(False), ("Q", "q", 1, [1], [3]))]
    text = stalled_step(comms, marks)
    assert text.startswith(", stopped at step 1 on the Q lane (")
    assert "replay" not in text


def test_every_step_reached_names_none():
    comms = _comms()
    assert stalled_step(comms, [(Reached(_Event(True)), ("Q", "q", 0, [1], [3]))]) == ""


def test_outside_a_capture_nothing_is_kept_and_a_replay_takes_its_keys_marks():
    comms = _comms()
    with capture_marks(comms, "key"):  # not capturing (CPU): a no-op
        mark_captured_step(comms, "Q", ("q", 0, [1], [3]))
    assert comms.captured is None and comms.graph_marks == {}
    kept = [(Reached(_Event(False)), ("Q", "q", 0, [1], [3]))]
    comms.graph_marks["key"] = kept
    replay_marks(comms, "key")
    assert comms.marks == kept and comms.marks is not kept  # a copy: the watchdog takes it
    replay_marks(comms, "other")
    assert comms.marks == []
    replay_marks(None, "key")  # a ring of one: nothing to do
