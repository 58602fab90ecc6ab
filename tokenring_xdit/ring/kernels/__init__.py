"""Per-block attention kernels: one record type, one registry, one probe, one `auto` order.

- base.py: the `Kernel` record (forward, backward or None, deterministic, devices, dtypes,
  layouts, packed-documents support) and the calling contract; `KeyedKernel`; empty blocks.
- exact.py, sdpa.py, flashattn.py, fa4.py, varlen.py: the kernels, one family per module,
  each ending in its records (fa4: flash-attn 4, by name only).
- wrappers.py: GQA, packed documents' segments and the swapped wire layout, around any record.
- window.py: a windowed call's record (its own kernel, and a kernel for the banded blocks).
- probe.py: the one probe (a tiny run compared with the exact kernel), cached.
- names.py: every kernel's name, its record's place, devices and role, `auto`'s orders and the
  packed cost model's kernels, without torch (the CLI, hosts and packed/ read names there).
- registry.py: every record by name (loaded from names.py's table), selection for inference,
  training, packed documents and GQA (seam/kernel_choice.py: what a call's `kernel` becomes).

Adding a kernel: define its forward (and backward, or None) and its `Kernel(...)` record in a
module here (its family's, or a new one), then give it its line in names.py (and a place in
`AUTO` where `auto` may pick it). Inference (`KERNELS[name]`: the record's forward without
causality), training (`PAIRS[name]`), GQA (probed: native or expanded), packed documents (per
segment unless the record says otherwise), the swapped layout, the CLI's `--kernel` choices,
the names in error messages and the call's kernel choice then follow.

Importing this package imports no torch: the names below load their modules on first use.
"""

# public name -> the module (of this package) that defines it
_LAZY = {
    **dict.fromkeys(
        ("HALF", "BlockKernel", "Kernel", "KernelPair", "KeyedKernel", "empty_block",
         "empty_partial", "lse_bhs", "row_delta", "run_block"), "base"),
    **dict.fromkeys(("MASKED", "MATH", "segments_mask"), "exact"),
    "has_flash_attn": "flashattn",
    "KernelName": "names",
    "runs_once": "probe",
    **dict.fromkeys(
        ("DOC_KERNELS", "KERNELS", "PAIRS", "REGISTRY", "auto_order", "doc_pair", "gqa_kernel",
         "gqa_pair", "select_kernel", "select_pair"), "registry"),
    **dict.fromkeys(("banded", "window_pair"), "window"),
    **dict.fromkeys(("FLASH_VARLEN", "segment_runs"), "varlen"),
    **dict.fromkeys(
        ("SwappedKernel", "expand_kv", "fold_kv_grad", "kv_groups", "segments_pair"), "wrappers"),
}  # fmt: skip
# The inference kernels by their old module-level names (tokenring_xdit.ring.kernels.math, ...).
_BLOCKS = {
    "flash_attn": "flash_attn", "torch_cudnn": "cudnn", "torch_flash": "torch_flash",
    "torch_efficient": "torch_efficient", "cpu_flash": "cpu_flash", "math": "math",
}  # fmt: skip
__all__ = [*_LAZY, *_BLOCKS]


def __getattr__(name: str):
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    if name in _BLOCKS:
        return importlib.import_module(f"{__name__}.registry").KERNELS[_BLOCKS[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
