"""`resolve_kernel`: what a call's `kernel` argument becomes (a block kernel for inference, a
record for training), its CUDA-graph key and the family every rank must agree on.

A kernel that cannot be used here is reported as a `Problem` (KERNEL_UNUSABLE /
KERNEL_UNSUPPORTED) for the input check, so every rank raises through it instead of this one
alone. It lives in the seam, not in kernels/, because it speaks the input check's codes."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import NamedTuple

import torch

from ..agree.problems import Problem
from ..kernels.base import Kernel, KeyedKernel
from ..kernels.names import PACKED_ONLY
from ..kernels.registry import (
    REGISTRY,
    check_layout,
    doc_pair,
    gqa_kernel,
    gqa_pair,
    select_kernel,
    select_pair,
)
from ..kernels.window import window_pair
from ..tensor_layout import Layout


class KernelChoice(NamedTuple):
    """fn: the block kernel (inference) or `Kernel` record (training), None when unusable;
    key: its CUDA-graph key (None: not graphed); family: what the ranks agree on (a name, a
    kernel key, or ("pair", name, deterministic)); problem / problem_text: for the input check."""

    fn: Callable | Kernel | None
    key: Hashable | None
    family: Hashable
    problem: Problem
    problem_text: str


def resolve_kernel(
    kernel, kernel_key: Hashable | None, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    layout: Layout, *, train: bool, deterministic: bool, packed: bool, order: tuple = (),
    windowed: bool = False,
) -> KernelChoice:  # fmt: skip
    """The kernel of a call: `kernel` is "auto", a registry name, a `KeyedKernel` or a callable
    (q, k, v, scale, layout) -> (out, lse); training (`train`) takes names only. `order`: a
    packed call's priced kernels, fastest predicted first (priced in the call's preparation),
    from which `auto` picks its packed kernel (registry.auto_doc_kernel). `windowed`: a call
    with a sliding window (training path; kernels/window.py adds the kernel of its bands)."""
    try:
        gqa = q.shape[layout.head_dim] != k.shape[layout.head_dim]  # K/V keep their head count
        args = (q.device, q.dtype, q.shape[3], v.shape[3])
        if train:
            record = _training_record(kernel, args, deterministic, packed or _by_segments(
                kernel, windowed), order)  # fmt: skip
            if windowed:
                record = window_pair(record, *args, deterministic)
            check_layout(record, layout)
            fn = gqa_pair(record, *args) if gqa else record
            return KernelChoice(fn, None, ("pair", record.name, deterministic), Problem.NONE, "")
        if isinstance(kernel, KeyedKernel):
            fn, key, family = kernel, kernel.key, kernel.key
        elif callable(kernel):
            # by name, not the object: a closure made per call must not be kept by the digest cache
            name = f"{getattr(kernel, '__module__', '')}.{getattr(kernel, '__qualname__', '')}"
            fn, key, family = kernel, kernel_key, kernel_key if kernel_key is not None else name
        else:
            family, fn = select_kernel(kernel, *args)
            check_layout(REGISTRY[family], layout)
            key = kernel
        if gqa:
            fn, key = gqa_kernel(fn, key, *args)
        return KernelChoice(fn, key, family, Problem.NONE, "")
    except (ValueError, NotImplementedError, RuntimeError, IndexError) as exc:
        # (IndexError: q is not 4-d, which the check reports as such)
        code = (
            Problem.KERNEL_UNSUPPORTED
            if isinstance(exc, NotImplementedError)
            else Problem.KERNEL_UNUSABLE
        )
        return KernelChoice(None, None, "unusable", code, str(exc).splitlines()[0][:300])


def _by_segments(kernel, windowed: bool) -> bool:
    """A windowed call may name a kernel that takes segments (`masked`, `flash_varlen`): it
    then runs every block, as it runs packed documents'."""
    return windowed and kernel in PACKED_ONLY


def _training_record(kernel, args, deterministic: bool, packed: bool, order: tuple) -> Kernel:
    if not packed:
        return select_pair(kernel, *args, deterministic)
    record = doc_pair(kernel, *args, lambda name: select_pair(name, *args, deterministic), order)
    if deterministic and not record.deterministic:
        raise NotImplementedError(
            f"deterministic=True: the {record.name!r} backward is not deterministic; "
            "use kernel='masked' (exact) or deterministic=False"
        )
    return record
