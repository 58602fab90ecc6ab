"""Per-block attention kernels: one record type, one registry, one probe, one `auto` order.

- base.py: the `Kernel` record (forward, backward or None, deterministic, devices, dtypes,
  layouts, packed-documents support) and the calling contract; `KeyedKernel`; empty blocks.
- exact.py, sdpa.py, flashattn.py, fa4.py, varlen.py: the kernels, one family per module,
  each ending in its records (fa4: flash-attn 4, by name only).
- wrappers.py: GQA, packed documents' segments and the swapped wire layout, around any record.
- probe.py: the one probe (a tiny run compared with the exact kernel), cached.
- registry.py: every record by name, the `auto` order, selection for inference, training,
  packed documents and GQA. resolve.py: `resolve_kernel`, what a call's `kernel` becomes.

Adding a kernel: define its forward (and backward, or None) and its `Kernel(...)` record in a
module here (its family's, or a new one), then list the record in registry.py's `REGISTRY` (and
its name in `_AUTO` where `auto` may pick it). Inference (`KERNELS[name]`: the record's forward
without causality), training (`PAIRS[name]`), GQA (probed: native or expanded), packed
documents (per segment unless the record says otherwise), the swapped layout, the names in
error messages and `resolve_kernel` then follow from the record.
"""

from .base import (
    HALF,
    BlockKernel,
    Kernel,
    KernelPair,
    KeyedKernel,
    empty_block,
    empty_partial,
    lse_bhs,
    row_delta,
    run_block,
)
from .exact import MASKED, MATH, segments_mask
from .flashattn import has_flash_attn
from .probe import runs_once
from .registry import (
    DOC_KERNELS,
    KERNELS,
    PAIRS,
    REGISTRY,
    auto_order,
    doc_pair,
    gqa_kernel,
    gqa_pair,
    select_kernel,
    select_pair,
)
from .resolve import KernelChoice, resolve_kernel
from .varlen import FLASH_VARLEN, segment_runs
from .wrappers import SwappedKernel, expand_kv, fold_kv_grad, kv_groups, segments_pair

# The inference kernels by their old module-level names (tokenring_xdit.ring.kernels.math, ...).
flash_attn = KERNELS["flash_attn"]
torch_cudnn = KERNELS["cudnn"]
torch_flash = KERNELS["torch_flash"]
torch_efficient = KERNELS["torch_efficient"]
cpu_flash = KERNELS["cpu_flash"]
math = KERNELS["math"]

__all__ = [
    "HALF", "BlockKernel", "Kernel", "KernelPair", "KeyedKernel", "SwappedKernel",
    "KernelChoice", "resolve_kernel", "REGISTRY", "KERNELS", "PAIRS", "DOC_KERNELS", "MASKED",
    "MATH", "FLASH_VARLEN", "auto_order", "select_kernel", "select_pair", "doc_pair",
    "gqa_kernel", "gqa_pair", "segments_pair", "segments_mask", "segment_runs", "kv_groups",
    "expand_kv", "fold_kv_grad", "empty_block", "empty_partial", "run_block", "lse_bhs",
    "row_delta", "runs_once", "has_flash_attn", "flash_attn", "torch_cudnn", "torch_flash",
    "torch_efficient", "cpu_flash", "math",
]  # fmt: skip
