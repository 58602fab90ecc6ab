"""Every code the agreement's header carries, defined once, with the words errors use for it.

All ranks run the same version, so codes only need to be equal within one version; settings
that come from the configuration are their index in config's tuples (the allowed values are
written once, in config.py).
"""

from __future__ import annotations

from enum import IntEnum, IntFlag

import torch

from ... import config
from ..tensor_layout import LAYOUTS

__all__ = [
    "Choice",
    "ChoiceSource",
    "DEVICE_TYPES",
    "DOCS_BY_POSITIONS",
    "DTYPES",
    "Kind",
    "Mode",
    "TRANSPORT_CODES",
    "VALIDATE_CODES",
]


class Kind(IntEnum):
    """What a header asks for: a TokenRing call, or a host's ring choice."""

    CALL = 1
    CHOICE = 2


class Mode(IntFlag):
    """A call's causal flag and gradient mode (both choose the schedule)."""

    NON_CAUSAL = 0
    CAUSAL = 1
    GRAD = 2

    @property
    def words(self) -> str:
        what = "causal" if self & Mode.CAUSAL else "non-causal"
        return f"{what} training (inputs require grad)" if self & Mode.GRAD else f"{what} inference"


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
        return {Choice.HOST: "the host's own ring", Choice.TOKEN_RING: "TokenRing"}.get(
            self, "auto"
        )


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


DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
DEVICE_TYPES = ("cpu", "cuda", "meta", "xpu", "mps", "hpu", "npu", "mtia")
VALIDATE_CODES = {mode: i for i, mode in enumerate(config.VALIDATE_MODES)}
TRANSPORT_CODES = {name: i for i, name in enumerate(config.TRANSPORTS)}
DOCS_BY_POSITIONS = -1  # the documents slot of a call packed by position ids (else a digest)
# a layout travels as its sequence dim (a split as its own code: ring/split/value.py)
LAYOUT_WORDS = {layout.seq_dim: name for name, layout in LAYOUTS.items()}


def device_name(index: int) -> str:
    return DEVICE_TYPES[index] if 0 <= index < len(DEVICE_TYPES) else "another device type"


def dtype_code(dtype: torch.dtype) -> int:
    return DTYPES.index(dtype) if dtype in DTYPES else -1


def device_code(device: torch.device) -> int:
    return DEVICE_TYPES.index(device.type) if device.type in DEVICE_TYPES else -1
