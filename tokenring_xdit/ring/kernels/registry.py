"""The registry: every kernel record by name (each found where names.py says it lives), and
the selection of a record for a call (inference, training, packed documents, GQA)."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
from collections.abc import Callable

import torch

from .base import HALF, BlockKernel, Kernel, KeyedKernel
from .exact import MASKED, MATH
from .names import AUTO, DENSE, PACKED_ONLY, KernelName
from .probe import works
from .varlen import FLASH_VARLEN
from .wrappers import ExpandedBlock, expanded, segments_pair

log = logging.getLogger("tokenring_xdit")


def _record(name: KernelName) -> Kernel:
    """The `Kernel` record at `name.record`, checked against its line in names.py."""
    module, attr = name.record.split(".")
    record = getattr(importlib.import_module(f".{module}", __package__), attr)
    if record.name != name.value or record.segments != name.packed_only:
        raise TypeError(f"{name.record} is not the record names.py describes as {name}")
    return record


# Dense kernels, by the names users pass (kernel=...) and yunchang's attn_type maps to.
REGISTRY: dict[str, Kernel] = {n: _record(KernelName(n)) for n in DENSE}
# Kernels for packed documents only (they take the segments themselves).
DOC_REGISTRY: dict[str, Kernel] = {n: _record(KernelName(n)) for n in PACKED_ONLY}
DOC_KERNELS = PACKED_ONLY

KERNELS: dict[str, BlockKernel] = {name: k.block for name, k in REGISTRY.items()}  # inference
PAIRS: dict[str, Kernel] = dict(REGISTRY)  # training (a record without a backward: `train_as`)


def auto_order(device: torch.device, dtype: torch.dtype, train: bool) -> tuple[str, ...]:
    """The kernels `auto` tries for this device and dtype, fastest first."""
    mode = "inference"
    if train:
        hopper = device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9
        mode = "training-sm90" if hopper else "training"
    # inference treats any device but the CPU as CUDA, training any but CUDA as the CPU
    cuda = device.type == "cuda" if train else device.type != "cpu"
    kind = "cuda" if cuda else "cpu"
    return tuple(
        name
        for name in AUTO[mode]
        if kind in KernelName(name).devices
        and (dtype in HALF or not REGISTRY[name].half_only)
        and REGISTRY[name].installed()
    )


def check_layout(record: Kernel, layout) -> None:
    """Refuse a layout the record does not take (every built-in one takes both)."""
    if layout not in record.layouts:
        names = [x.name for x in record.layouts]
        raise ValueError(f"kernel {record.name!r} takes layouts {names}, not {layout.name!r}")


def _check_installed(record: Kernel) -> None:
    """Refuse a record whose optional package is missing (before any ring step runs it)."""
    if not record.installed():
        package = record.package
        raise ValueError(
            f"kernel {record.name!r} needs the {package} package (pip install {package})"
        )


def _unknown(name) -> ValueError:
    return ValueError(f"unknown kernel {name!r}; use 'auto' or one of {sorted(REGISTRY)}")


def select_kernel(
    name: str, device: torch.device, dtype: torch.dtype, d_qk: int, d_v: int
) -> tuple[str, BlockKernel]:
    """Resolve a kernel name ("auto" = fastest that works for this device/dtype/head size)."""
    if name == "auto":
        name = _first_block(device.type, dtype, d_qk, d_v)
    if name not in REGISTRY:
        raise _unknown(name)
    _check_installed(REGISTRY[name])
    return name, KERNELS[name]


@functools.cache
def _first_block(device: str, dtype: torch.dtype, d_qk: int, d_v: int) -> str:
    for name in auto_order(torch.device(device), dtype, train=False):
        if works(KERNELS[name], "forward", torch.device(device), dtype, d_qk, d_v):
            return name
    raise RuntimeError(f"no attention kernel with lse for {dtype} head size {d_qk} on {device}")


def select_pair(
    kernel: str, device: torch.device, dtype: torch.dtype, d_qk: int, d_v: int, deterministic: bool
) -> Kernel:
    """The training record for a kernel name ("auto": the fastest that works here)."""
    if not isinstance(kernel, str):
        raise NotImplementedError(
            "TokenRing training and causal attention need a kernel with a matching backward; a "
            f"custom block kernel has none. Pass kernel='auto' or one of {sorted(REGISTRY)} (from "
            "yunchang: attn_type FA, TORCH_FLASH, TORCH_EFFICIENT, TORCH_CUDNN or TORCH_MATH, "
            "no attn_processor)"
        )
    name = kernel
    if kernel == "auto":
        order = auto_order(device, dtype, train=True)
        name = next(
            n for n in order if n == "math" or _pair_works(n, device.type, dtype, d_qk, d_v)
        )
    if name not in REGISTRY:
        raise _unknown(name)
    record = _trained(REGISTRY[name], dtype)
    _check_installed(record)
    if deterministic and not record.deterministic:
        if record.deterministic_backward is not None:
            return dataclasses.replace(
                record, backward=record.deterministic_backward, deterministic=True
            )
        raise NotImplementedError(
            f"deterministic=True: the {record.name!r} backward is not deterministic; use "
            "flash-attn (yunchang attn_type FA) or the exact 'math' kernel (TORCH_MATH), or "
            "deterministic=False"
        )
    return record


def _trained(record: Kernel, dtype: torch.dtype) -> Kernel:
    """`record`, or for one without a backward the record that trains in its place (said once
    in the log: a user who named the kernel should see that another one runs)."""
    if record.backward is not None:
        return record
    stand_in = REGISTRY[record.train_as]
    if stand_in.half_only and dtype not in HALF:
        stand_in = MATH
    _say_trained_as(record.name, stand_in.name)
    return stand_in


@functools.cache
def _say_trained_as(name: str, stand_in: str) -> None:
    log.warning(
        "TokenRing: kernel %r has no usable ring backward; training runs %r in its place (same "
        "attention, exact; docs/training-internals.md, Kernels)",
        name,
        stand_in,
    )


@functools.cache
def _pair_works(name: str, device: str, dtype: torch.dtype, d_qk: int, d_v: int) -> bool:
    """The probe of a training record (`math`, the reference, always works)."""
    return name == "math" or works(REGISTRY[name], "pair", torch.device(device), dtype, d_qk, d_v)


def auto_doc_kernel(device_type: str, dtype, order, usable: Callable[[str], bool]) -> str | None:
    """The kernel name `auto` runs a packed-documents call with: "masked" off CUDA half
    precision; on it the first of `order` (the priced packed kernels, fastest predicted first:
    the call's preparation prices them, ring/packed/) that `usable(name)` says works for this
    dtype and head size (the probe); None if none does. Pure given `usable`: every rank with
    the same inputs gets the same name."""
    if device_type != "cuda" or dtype not in HALF:
        return MASKED.name  # exact, and the CPU's fastest masked option at these sizes
    return next((name for name in order if usable(name)), None)


@functools.cache
def _doc_works(name: str, device: str, dtype: torch.dtype, d_qk: int, d_v: int) -> bool:
    """The probe of a priced packed kernel on two documents in one block."""
    record = FLASH_VARLEN if name == FLASH_VARLEN.name else segments_pair(REGISTRY[name])
    return works(record, "segments", torch.device(device), dtype, d_qk, d_v)


def doc_pair(kernel, device: torch.device, dtype, d_qk: int, d_v: int, dense, order=()) -> Kernel:
    """The record for a packed-documents call. kernel: "auto", "masked", "flash_varlen", or a
    dense kernel name (then called per segment). `dense(name)` selects a dense record
    (select_pair with the call's arguments); `order`: the priced kernels `auto` picks from,
    fastest predicted first (`auto_doc_kernel`)."""
    fast = device.type == "cuda" and dtype in HALF
    if kernel in DOC_REGISTRY:
        if kernel == "flash_varlen" and not fast:
            raise ValueError("kernel 'flash_varlen' needs CUDA tensors in float16/bfloat16")
        return DOC_REGISTRY[kernel]
    if kernel == "auto":
        usable = lambda name: _doc_works(name, device.type, dtype, d_qk, d_v)  # noqa: E731
        kernel = auto_doc_kernel(device.type, dtype, order, usable) or "auto"
        if kernel in DOC_REGISTRY:
            return DOC_REGISTRY[kernel]
    record = dense(kernel)
    if record.packed_as is not None:
        return DOC_REGISTRY[record.packed_as]
    if record.packed_refused is not None and device.type == "cuda":
        raise NotImplementedError(
            f"kernel {record.name!r} with packed documents: {record.packed_refused}"
        )
    return segments_pair(record)


def gqa_kernel(kernel: BlockKernel, key, device: torch.device, dtype, d_qk: int, d_v: int):
    """(kernel, graph key) for a call with fewer K/V heads than query heads: the kernel itself
    where it takes them (the probe says), else one that expands K/V per block."""
    if works(kernel, "gqa-forward", device, dtype, d_qk, d_v):
        return kernel, key
    wrapped = ExpandedBlock(kernel)
    new_key = None if key is None else ("gqa-expanded", key)
    return (KeyedKernel(wrapped, new_key) if new_key is not None else wrapped), new_key


def gqa_pair(record: Kernel, device: torch.device, dtype, d_qk: int, d_v: int) -> Kernel:
    """The record for a call with fewer K/V heads than query heads: `record` itself where its
    kernels take them, else one that expands K/V per block and folds dK/dV back."""
    if works(record, "gqa-pair", device, dtype, d_qk, d_v):
        return record
    return expanded(record)
