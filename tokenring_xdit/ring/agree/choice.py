"""A host's ring choice, agreed on every ring rank before either ring runs.

Ranks that picked different rings (one TokenRing, its peer the host's all-gather) would meet in
two protocols and hang; the choice travels in the same header as a call's check instead, so they
fail together with one error. `Choice` and `ChoiceSource` are codes.py's.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch
import torch.distributed as dist

from ...config import CommSettings
from ..comm import RingPosition, comms_of
from .codes import Choice, ChoiceSource, Kind
from .exchange import always, cached, exchange, remember
from .header import Header, digest

__all__ = ["Choice", "ChoiceSource", "agree_ring_choice", "raise_choice"]


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
    header = Header(
        kind=Kind.CHOICE, choice=choice, source=source, q_len=lengths[0], kv_len=lengths[1],
        inputs=digest(auto_inputs) if choice == Choice.AUTO else 0,
    )  # fmt: skip
    device_type = "cpu" if comms.backend == "gloo" else "cuda"
    key = ("choice", pos.group, tuple(header.row()), device, epoch)
    if not always(validate, device_type):
        hit = cached(key)
        if hit is not None:
            return hit
    headers = exchange(comms, pos.rank, header)
    raise_choice(headers)
    longest = (max(h.q_len for h in headers), max(h.kv_len for h in headers))
    remember(key, longest)
    return longest


def raise_choice(headers: list[Header]) -> None:
    """One ValueError on every rank when the ring's ranks chose different rings."""
    choices = [(h.kind, h.choice, h.inputs) for h in headers]
    if len(set(choices)) <= 1:
        return
    lines = []
    for r, h in enumerate(headers):
        if h.kind == Kind.CALL:
            lines.append(f"rank {r}: TokenRing (a direct TokenRing call)")
            continue
        inputs = f" (decides from inputs #{h.inputs % 10007})" if h.choice == Choice.AUTO else ""
        lines.append(f"rank {r}: {h.choice.words}, chosen by {h.source.text}{inputs}")
    raise ValueError(
        "TokenRing: the ring ranks chose different ring attentions for the same call, so "
        "neither can run:\n  " + "\n  ".join(lines) + "\nSet TOKENRING_XDIT_RING_IMPL / "
        "--ring_impl_type / set_xdit_ring_impl() identically on every rank; under `auto` also "
        "TOKENRING_XDIT_FABRIC, NCCL_P2P_DISABLE, CUDA graphs and requires_grad"
    )
