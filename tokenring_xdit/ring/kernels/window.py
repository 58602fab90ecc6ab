"""The record of a call with a sliding window: its blocks are the causal flag (the window left
them alone: the call's own kernel runs them), or segments, some with a band (ring/segments.py:
a kernel that takes bands runs those, names.WINDOWED, the first that runs here).

The window plan (ring/packed/window_plan.py) decides which blocks are which; this only routes
a block's mask to the kernel for it, in the forward and the backward alike.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from .base import HALF, Kernel
from .names import WINDOWED, KernelName
from .probe import works
from .registry import DOC_REGISTRY, REGISTRY
from .wrappers import expanded

FLASH_VARLEN, MASKED = KernelName.FLASH_VARLEN.value, KernelName.MASKED.value

__all__ = ["window_pair", "banded", "runs_block"]


def _route(dense: Kernel, band: Kernel, tall: Kernel | None, mask) -> Kernel:
    """The record a block's mask goes to: the call's own for a causal flag (and for plain
    segments where it takes segments), the band kernel for any other segments, `tall` (if
    any) where a banded segment is taller than wide (`banded` says why)."""
    if isinstance(mask, bool) or (dense.segments and all(s.band is None for s in mask)):
        return dense
    if tall is not None and any(_tall(s) for s in mask):
        return tall
    return band


def runs_block(record: Kernel, mask) -> Kernel:
    """The record that runs a block of `mask` in `record`: a `banded` record's choice, any
    other record itself (read only: benchmarks/ceiling.py times each kernel's blocks apart)."""
    f = record.forward
    return _route(f.dense, f.band, f.tall, mask) if isinstance(f, _Forward) else record


def _tall(s) -> bool:
    return s.band is not None and s.q1 - s.q0 > s.k1 - s.k0


@dataclass(frozen=True)
class _Forward:
    dense: Kernel
    band: Kernel
    tall: Kernel | None

    def __call__(self, q, k, v, scale, layout, mask):
        record = _route(self.dense, self.band, self.tall, mask)
        return record.forward(q, k, v, scale, layout, mask)


@dataclass(frozen=True)
class _Backward:
    dense: Kernel
    band: Kernel
    tall: Kernel | None

    def __call__(self, dout, q, k, v, out, lse, delta, scale, layout, mask):
        record = _route(self.dense, self.band, self.tall, mask)
        return record.backward(dout, q, k, v, out, lse, delta, scale, layout, mask)


@functools.lru_cache(maxsize=64)
def banded(dense: Kernel, band: Kernel, grouped: bool = False) -> Kernel:
    """`dense` for the blocks the window leaves alone, `band` for its segments: on the call's
    K/V heads where it takes fewer K/V heads than query heads itself (`grouped`: the probe
    said so), else on K/V expanded per block (a no-op where the heads are equal; the copy of a
    whole tile's K/V made a 127-row corner block cost as much as a 32k-row band on H200). Flash's
    window on a banded segment taller than wide (more queries than keys) came out wrong on
    H200, torch 2.11 (a run of packed documents; square and wide ones matched the masked
    kernel): those blocks run the exact masked kernel instead, chosen here once."""
    tall = _tall_fallback(band)
    band = band if grouped else expanded(band)
    return dataclasses.replace(
        dense, name=f"{dense.name}+window:{band.name}", forward=_Forward(dense, band, tall),
        backward=_Backward(dense, band, tall),
        deterministic=dense.deterministic and band.deterministic, deterministic_backward=None,
        segments=True, bands=True,
    )  # fmt: skip


def window_pair(
    record: Kernel, device: torch.device, dtype, d_qk: int, d_v: int, deterministic: bool = False
) -> Kernel:
    """The record of a windowed call whose own kernel is `record` (a dense or a packed one):
    itself where it takes bands (flash_varlen too, through `banded` for its tall bands), else
    `banded` with the first of names.WINDOWED that runs on this device and dtype (deterministic
    where asked) and passes the bands probe, on grouped K/V where it passes that probe with them
    too."""
    if record.bands and _tall_fallback(record) is None:
        return record
    band = record if record.bands else next(
        r for r in map(_band_record, WINDOWED)
        if device.type in KernelName(r.name).devices and (dtype in HALF or not r.half_only)
        and (r.deterministic or not deterministic) and _bands_work(r.name, device.type, dtype,
                                                                   d_qk, d_v)
    )  # fmt: skip
    grouped = works(band, "gqa-bands", device, dtype, d_qk, d_v)
    return banded(record, band, grouped)


def _tall_fallback(band: Kernel) -> Kernel | None:
    """What runs a block with a banded segment taller than wide instead of `band` (None: `band`
    itself): flash's window got those wrong on H200 (`banded`), so the exact masked kernel."""
    return expanded(DOC_REGISTRY[MASKED]) if band.name == FLASH_VARLEN else None


def _band_record(name: str) -> Kernel:
    return DOC_REGISTRY[name] if name in DOC_REGISTRY else REGISTRY[name]


@functools.cache
def _bands_work(name: str, device: str, dtype: torch.dtype, d_qk: int, d_v: int) -> bool:
    """The bands probe of one kernel (`masked`, the reference, always works)."""
    return name == "masked" or works(_band_record(name), "bands", torch.device(device), dtype,
                                     d_qk, d_v)  # fmt: skip
