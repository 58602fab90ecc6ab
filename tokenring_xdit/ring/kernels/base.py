"""The kernel record and what every per-block kernel shares.

A kernel is one `Kernel` record: its forward, its backward (or None: inference only), whether
that backward is deterministic, the dtypes it runs on, the layouts it takes, how it serves
packed documents and the optional package it needs (its name's devices: names.py). Inference
calls the record's forward (`Kernel.block`, causal off), training its forward and backward;
GQA, packed documents' segments and the swapped wire layout are wrappers around a record
(wrappers.py), never separate kernels.

forward(q, k, v, scale, layout, mask) -> (out in q's layout and dtype, lse (b, h, s_q) fp32,
natural log). `mask` is the causal flag (top-left aligned) or, for a record with
`segments=True`, a tuple of documents' `Segment`s (with `bands=True` also a sliding window's
banded ones, ring/segments.py). A kernel whose lse is a placeholder
(yunchang's TORCH_MATH / TORCH_CUDNN return zeros) is never a record: a ring merge with a fake
lse is silently wrong.

backward(dout, q, k, v, out, lse, delta, scale, layout, mask) -> (dq, dk, dv) in q's dtype, fed
the lse and delta = rowsum(dO * O) of the WHOLE attention row, so the per-block gradients of all
key blocks sum to the exact ones; `out` is None for a travelling query block (only delta
travels; the SDPA-style ops then get a stand-in with that row sum, standin.py).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import torch

from ..merge.partials import lse_merge
from ..tensor_layout import BHSD, BSHD, Layout
from .standin import row_delta_bhsd

__all__ = [
    "BlockKernel", "HALF", "Kernel", "KernelPair", "KeyedKernel", "empty_partial", "empty_block",
    "run_block", "lse_bhs", "row_delta", "from_bhsd", "RowsSeen", "merge_rows",
]  # fmt: skip

BlockKernel = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, float, Layout], tuple[torch.Tensor, torch.Tensor]
]

HALF = (torch.float16, torch.bfloat16)  # the dtypes of the fast CUDA kernels
# The public home of the kernels: inference kernels are named after it (their digest family).
PUBLIC_MODULE = __name__.rpartition(".")[0]


@dataclass(frozen=True)
class Kernel:
    """One per-block attention kernel (the module docstring has the calling contract)."""

    name: str
    forward: Callable
    backward: Callable | None  # None: inference only (see `train_as`)
    deterministic: bool  # the backward gives bit-identical results run to run
    half_only: bool = False  # fp16/bf16 only (so `auto` skips it for other dtypes)
    layouts: tuple[Layout, ...] = (BSHD, BHSD)
    # a deterministic backward where `backward` is not (flash-attn's deterministic mode)
    deterministic_backward: Callable | None = None
    # without a backward: the record that trains in its place (the exact `math` where that one
    # does not take the dtype); said in the log when it happens (registry.select_pair)
    train_as: str | None = None
    segments: bool = False  # the forward/backward take packed documents' segments themselves
    bands: bool = False  # ... and a window's banded segments (`Segment.band`)
    # packed documents: the record that runs them instead (None: this one per segment)
    packed_as: str | None = None
    packed_refused: str | None = None  # why it is refused with packed documents on CUDA
    # its ops take (b, h, s, d) views (SDPA's): run per segment, the segments are cut from such
    # views of the block (one transpose per tensor per block, not per segment)
    bhsd_ops: bool = True
    package: str | None = None  # the optional pip package it needs (refused without it)
    installed: Callable[[], bool] = lambda: True  # is that package installed?
    block: BlockKernel = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "block", _inference_block(self))

    def run_forward(self, q, k, v, scale: float, layout: Layout, causal):
        empty = empty_block(q, k, v, layout)
        return empty if empty is not None else self.forward(q, k, v, scale, layout, causal)

    def run_backward(self, dout, q, k, v, out, lse, delta, scale, layout, causal):
        """out: the merged output, or None (then delta is required); delta may be None with out."""
        if 0 in (q.shape[layout.seq_dim], k.shape[layout.seq_dim]):
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        return self.backward(dout, q, k, v, out, lse, delta, scale, layout, causal)


KernelPair = Kernel  # the name the training loops and older callers use


def _inference_block(kernel: Kernel) -> BlockKernel:
    """The record's forward without causality as a block kernel (q, k, v, scale, layout), named
    `tokenring_xdit.ring.kernels.<name>` (a callable's digest family is its qualified name)."""

    def block(q, k, v, scale: float, layout: Layout):
        return kernel.run_forward(q, k, v, scale, layout, False)

    block.__name__ = block.__qualname__ = kernel.name
    block.__module__ = PUBLIC_MODULE
    block.__doc__ = f"The {kernel.name!r} kernel's forward as a block kernel (no causality)."
    return block


@dataclass(frozen=True)
class KeyedKernel:
    """A block kernel with a name that is stable across calls (and equal on every rank), so
    calls that use it can be captured and replayed as CUDA graphs."""

    fn: BlockKernel
    key: Hashable

    def __call__(self, q, k, v, scale: float, layout: Layout):
        return self.fn(q, k, v, scale, layout)


def empty_partial(
    q, v, layout: Layout, dtype: torch.dtype | None = None, filled: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """The partial of queries that see no key: out 0 (in `dtype`, default q's) and lse -inf
    (the merge weighs it as nothing). `filled=False`: the same buffers uninitialised, for a
    caller that writes every row before reading it."""
    b, s_q, h, _ = layout.dims(q)
    shape = (b, s_q, h, v.shape[3]) if layout.seq_dim == 1 else (b, h, s_q, v.shape[3])
    if not filled:
        out = torch.empty(shape, dtype=dtype or q.dtype, device=q.device)
        return out, torch.empty((b, h, s_q), dtype=torch.float32, device=q.device)
    out = torch.zeros(shape, dtype=dtype or q.dtype, device=q.device)
    return out, torch.full((b, h, s_q), float("-inf"), dtype=torch.float32, device=q.device)


def empty_block(q, k, v, layout: Layout) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The partial of an empty query or key block (no kernel takes those; torch's CPU flash
    kernel even dies of SIGFPE), or None for a block with queries and keys."""
    if q.shape[layout.seq_dim] and k.shape[layout.seq_dim]:
        return None
    return empty_partial(q, v, layout)


def run_block(kernel: BlockKernel, q, k, v, scale: float, layout: Layout):
    """kernel(q, k, v, scale, layout), except for empty blocks."""
    empty = empty_block(q, k, v, layout)
    return empty if empty is not None else kernel(q, k, v, scale, layout)


class RowsSeen:
    """Which query rows of a packed block a kernel already wrote. In the documents layout
    (ring/packed/doc_split.py) a query piece meets two key pieces of its document in one block (the
    local front and back halves are not adjacent), so its second partial is merged, not copied."""

    def __init__(self, rows: int):
        self.seen = bytearray(rows)

    def first(self, q0: int, q1: int) -> bool:
        """True if no row of [q0, q1) was written yet; marks them written."""
        fresh = 1 not in self.seen[q0:q1]
        self.seen[q0:q1] = b"\x01" * (q1 - q0)
        return fresh


def merge_rows(out: torch.Tensor, lse: torch.Tensor, o, block_lse, lse_as_out) -> None:
    """Merge the partial (o, block_lse) into rows (out, lse) in place (rows still unwritten
    have out 0 and lse -inf). `lse_as_out` views an lse so it broadcasts against out. The
    block's lse is finite on every row it covers (each row sees a key)."""
    acc = torch.promote_types(out.dtype, torch.float32)
    lse_merge(out, lse, out, lse, o, block_lse, lse_as_out, acc=acc)


def lse_bhs(lse: torch.Tensor, batch: int, heads: int, seq: int) -> torch.Tensor:
    """A kernel's lse as (b, h, s) fp32: efficient pads it to a multiple of 32 queries, cuDNN
    may add a trailing 1, flash-style kernels give (b, h, s) already."""
    return lse.reshape(batch, heads, -1)[:, :, :seq].float()


def row_delta(dout: torch.Tensor, out: torch.Tensor, layout: Layout) -> torch.Tensor:
    """delta = rowsum(dO * O), (b, h, s) fp32 (one pass, fp32 math)."""
    return row_delta_bhsd(layout.to_bhsd(dout), layout.to_bhsd(out))


def from_bhsd(layout: Layout, grads) -> tuple[torch.Tensor, ...]:
    """(b, h, s, d) results back in `layout`."""
    return tuple(layout.from_bhsd(g) for g in grads)
