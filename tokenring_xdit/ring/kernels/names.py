"""Every kernel's name in one table that imports no torch (the CLI checks `--kernel` with it
before torch loads); registry.py, the host adapters, the packed cost model and the pack order
take their names from it. Adding a kernel: its module here (forward, backward, `Kernel` record)
and its line below; `auto` picks it once it also has a place in `AUTO`.
"""

from __future__ import annotations

import enum
from types import MappingProxyType

__all__ = ["KernelName", "AUTO", "DENSE", "PACKED_ONLY", "PRICED", "WINDOWED", "runs_on"]

CPU, CUDA, ANY = ("cpu",), ("cuda",), ("cpu", "cuda")


class KernelName(enum.Enum):
    """A kernel by name: `.value` is the string users pass, `KernelName("cudnn")` reads one
    (ValueError for an unknown name)."""

    record: str  # "module.RECORD": its `Kernel` record in this package
    devices: tuple[str, ...]  # the device types it runs on
    packed_only: bool  # packed documents only: it takes their segments itself

    def __new__(cls, value: str, record: str, devices: tuple[str, ...], packed_only=False):
        member = object.__new__(cls)
        member._value_ = value
        member.record, member.devices, member.packed_only = record, devices, packed_only
        return member

    # fmt: off
    # name                          record                  devices  packed documents only
    FLASH_ATTN = "flash_attn",      "flashattn.FLASH_ATTN", CUDA
    CUDNN = "cudnn",                "sdpa.CUDNN",           CUDA
    TORCH_FLASH = "torch_flash",    "sdpa.TORCH_FLASH",     CUDA
    TORCH_EFFICIENT = "torch_efficient", "sdpa.TORCH_EFFICIENT", CUDA
    CPU_FLASH = "cpu_flash",        "sdpa.CPU_FLASH",       CPU
    MATH = "math",                  "exact.MATH",           ANY
    FA4 = "fa4",                    "fa4.FA4",              CUDA
    MASKED = "masked",              "exact.MASKED",         ANY,  True
    FLASH_VARLEN = "flash_varlen",  "varlen.FLASH_VARLEN",  CUDA, True
    # fmt: on


_K = KernelName


def _names(*kernels: KernelName) -> tuple[str, ...]:
    return tuple(k.value for k in kernels)


# the names any call takes (`kernel=`; packed documents also take PACKED_ONLY's)
DENSE = _names(*(k for k in _K if not k.packed_only))
PACKED_ONLY = _names(*(k for k in _K if k.packed_only))
# the packed kernels the packed cost model prices (packed/data/cost_model.json holds their
# constants; benchmarks/fit_layout_cost.py fits them), in `auto`'s order on a tie
PRICED = _names(_K.FLASH_VARLEN, _K.CUDNN)
# the kernels that take a sliding window's banded segments (their records say `bands=True`), in
# the order a windowed call picks the one for its partly visible blocks (kernels/window.py):
# torch's flash op with its window arguments, else the exact masked kernel (any device)
WINDOWED = _names(_K.FLASH_VARLEN, _K.MASKED)

# `auto`: fastest first, then filtered by device, dtype, installed package and the probe
# (registry.auto_order). Inference: cuDNN reaches 450-680 TFLOP/s on H200 vs 265-358 for torch
# flash. Training: cuDNN runs ~1.7x torch flash on Hopper (550 vs 310 TFLOP/s fwd+bwd, H100)
# and is ahead of flash-attn 2 there; before Hopper flash-attn is the fast, well-trodden one.
# (Inference keeps flash-attn first on Hopper too: not measured against cuDNN there.) `fa4` is
# by name only (H200: forward slower than cuDNN on 2k-4k blocks, fwd+bwd ~10 % faster only from
# 8k-token blocks; a beta with seconds of JIT per configuration; docs/kernels-fa4.md).
AUTO = MappingProxyType({
    "inference": _names(_K.FLASH_ATTN, _K.CUDNN, _K.TORCH_FLASH, _K.TORCH_EFFICIENT, _K.CPU_FLASH,
                        _K.MATH),
    "training": _names(_K.FLASH_ATTN, _K.TORCH_FLASH, _K.CUDNN, _K.CPU_FLASH, _K.MATH),
    "training-sm90": _names(_K.CUDNN, _K.FLASH_ATTN, _K.TORCH_FLASH, _K.CPU_FLASH, _K.MATH),
})  # fmt: skip


def runs_on(device_type: str) -> tuple[str, ...]:
    """The dense kernels that run on `device_type` ("cpu", "cuda")."""
    return tuple(k.value for k in _K if not k.packed_only and device_type in k.devices)
