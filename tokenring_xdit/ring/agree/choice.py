"""A host's ring choice, agreed on every ring rank before either ring runs.

Ranks that picked different rings (one TokenRing, its peer the host's all-gather) would meet in
two protocols and hang; the choice travels in the same header as a call's check instead, so they
fail together with one error. `Choice` codes are indexes in config.RING_IMPLS, `ChoiceSource`
codes name where a choice came from (hosts/selection.py's sources).
"""

from __future__ import annotations

from collections.abc import Hashable
from enum import IntEnum

import torch
import torch.distributed as dist

from ... import config
from ...config import CommSettings
from ..comm import RingPosition, comms_of
from .exchange import always, cached, exchange, remember
from .header import CHOICE, INPUTS, KIND, KIND_CALL, KIND_CHOICE, META_LEN, SKV, SOURCE, SQ, digest

__all__ = ["Choice", "ChoiceSource", "agree_ring_choice", "raise_choice"]


class Choice(IntEnum):
    """Which ring a host runs; the value is the name's index in config.RING_IMPLS."""

    HOST = config.RING_IMPLS.index("default")
    TOKEN_RING = config.RING_IMPLS.index("token_ring")
    AUTO = config.RING_IMPLS.index("auto")

    @classmethod
    def of(cls, name: str) -> Choice:
        return cls(config.RING_IMPLS.index(name))

    @property
    def words(self) -> str:
        return ("the host's own ring", "TokenRing", "auto")[self.value]


class ChoiceSource(IntEnum):
    """Where a host's choice came from, strongest last; `text` is how logs and errors name it."""

    DEFAULT = 0  # the texts are config.RING_IMPL_SOURCES, in this order
    PYTHON = 1
    FLAG = 2
    ENV = 3

    @property
    def text(self) -> str:
        return config.RING_IMPL_SOURCES[self.value]

    @classmethod
    def of(cls, text: str) -> ChoiceSource:
        """The source a text names (DEFAULT for one we do not know)."""
        for source in cls:
            if source.text == text:
                return source
        return cls.DEFAULT


def agree_ring_choice(
    group: dist.ProcessGroup,
    choice: Choice | str,
    source: ChoiceSource | str,
    auto_inputs: Hashable,
    lengths: tuple[int, int],
    device: torch.device,
    validate: str,
    epoch: Hashable = 0,
    comm: CommSettings | None = None,
) -> tuple[int, int]:
    """A host's ring choice for one call, agreed on every ring rank before either ring runs.

    choice: a Choice or its name in config.RING_IMPLS; source: a ChoiceSource or its text;
    auto_inputs: what `auto` decides from besides the shapes (fabric, graphs, gradients: equal
    on every rank or an error); epoch: changes whenever this rank's choice was changed (the
    cache keys on it, so a rank that switched rings exchanges again); comm: how the ring's
    communicators are made if this call makes them. Returns the longest
    (q, kv) local lengths over the ring, so `auto` decides the same on every rank.
    """
    choice = Choice.of(choice) if isinstance(choice, str) else Choice(choice)
    source = ChoiceSource.of(source) if isinstance(source, str) else ChoiceSource(source)
    pos = RingPosition.of(group)
    if pos.size == 1:
        return lengths
    comms = comms_of(pos.group, comm)
    comms.ensure_usable()
    meta = [0] * META_LEN
    meta[KIND], meta[CHOICE] = KIND_CHOICE, int(choice)
    meta[SOURCE] = int(source)
    meta[INPUTS] = digest(auto_inputs) if choice == Choice.AUTO else 0
    meta[SQ], meta[SKV] = lengths
    device_type = "cpu" if comms.backend == "gloo" else "cuda"
    key = ("choice", pos.group, tuple(meta), device, epoch)
    if not always(validate, device_type):
        hit = cached(key)
        if hit is not None:
            return hit
    metas = exchange(comms, pos.rank, meta)
    raise_choice(metas)
    longest = (max(m[SQ] for m in metas), max(m[SKV] for m in metas))
    remember(key, longest)
    return longest


def raise_choice(metas: list[list[int]]) -> None:
    """One ValueError on every rank when the ring's ranks chose different rings."""
    choices = [(m[KIND], m[CHOICE], m[INPUTS]) for m in metas]
    if len(set(choices)) <= 1:
        return
    lines = []
    for r, m in enumerate(metas):
        what = Choice(m[CHOICE]).words if m[CHOICE] in Choice._value2member_map_ else "?"
        if m[KIND] == KIND_CALL:
            lines.append(f"rank {r}: TokenRing (a direct TokenRing call)")
            continue
        inputs = f" (decides from inputs #{m[INPUTS] % 10007})" if m[CHOICE] == Choice.AUTO else ""
        lines.append(f"rank {r}: {what}, chosen by {ChoiceSource(m[SOURCE]).text}{inputs}")
    raise ValueError(
        "TokenRing: the ring ranks chose different ring attentions for the same call, so "
        "neither can run:\n  " + "\n  ".join(lines) + "\nSet TOKENRING_XDIT_RING_IMPL / "
        "--ring_impl_type / set_xdit_ring_impl() identically on every rank; under `auto` also "
        "TOKENRING_XDIT_FABRIC, NCCL_P2P_DISABLE, CUDA graphs and requires_grad"
    )
