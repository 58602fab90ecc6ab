"""The K/V family with autograd: the Function, the entry a call seam calls, and a thin entry.

`kv_ring_attn(q, k, v, ring=..., pair=..., ...)` takes an agreed `Ring` (its rank, size and
lanes) and a kernel record (GQA-wrapped where the K/V have fewer heads); `kv_lens` are every
rank's local K/V lengths (default: the ring's query lengths, self-attention). Causal calls need
zigzag shards (rank r holds chunks r and 2N-1-r of 2N), as TokenRing's causal path.
`kv_ring_attn_func` is the thin entry for tests and benchmarks: it agrees the shapes across the
group itself (one error on every rank) and picks the kernel.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..agreed_ring import Ring
from ..comm import RingPosition, comms_of
from ..kernels import KernelPair, gqa_pair, select_pair
from ..schedules.kv_both_ways import split_by_heads
from ..tensor_layout import Layout, get_layout
from .function import _Held
from .kv_backward import kv_backward
from .kv_forward import kv_forward
from .kv_halves import KvCall

__all__ = ["KvRingAttention", "kv_ring_attn", "kv_ring_attn_func"]


class KvRingAttention(torch.autograd.Function):
    """out, lse = the K/V family's attention of q against every rank's k, v; saves this rank's
    q, k, v, out and lse only."""

    @staticmethod
    def forward(ctx, q, k, v, call: KvCall, ring: Ring, kv_lens: tuple[int, ...]):
        out, lse = kv_forward(call, ring, kv_lens, q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.call, ctx.held, ctx.kv_lens = call, _Held(ring), kv_lens
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        ring = ctx.held.ring  # None once the ring's communicators were released
        if ring is None:
            raise RuntimeError(_GONE)
        grads = kv_backward(ctx.call, ring, ctx.kv_lens, dout, *ctx.saved_tensors)
        return (*grads, None, None, None)


_GONE = (
    "K/V ring backward: the ring's process group was destroyed (or its communicators "
    "released) after the forward; run backward before destroy_process_group"
)


def kv_ring_attn(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, ring: Ring, pair: KernelPair,
    causal: bool, scale: float, layout: Layout, kv_lens: tuple[int, ...] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(out, lse (b, h, s) fp32) of the K/V family on an agreed ring, with autograd."""
    kv_lens = tuple(kv_lens) if kv_lens is not None else ring.q_lens
    call = KvCall(pair, layout, scale, causal, split_by_heads(k.shape[layout.head_dim]))
    return KvRingAttention.apply(q, k, v, call, ring, kv_lens)


# What the thin entry agrees: every field but the lengths must be equal on every rank.
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_FIELDS = ("problem", "batch", "heads", "kv_heads", "head_dim", "v_head_dim", "dtype", "causal")


def kv_ring_attn_func(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
    group: dist.ProcessGroup | None = None, kernel: str = "auto", layout: str = "bshd",
    softmax_scale: float | None = None,
) -> torch.Tensor:  # fmt: skip
    """The K/V family's attention over `group` (None: the default group), with autograd."""
    lay = get_layout(layout)
    pos = RingPosition.of(group)
    b, s_q, h, d = lay.dims(q)
    _, s_kv, h_kv, d_v = lay.dims(v)
    problem = h_kv < 1 or h % h_kv != 0 or k.shape[:3] != v.shape[:3] or k.shape[0] != b
    problem = int(problem or k.shape[3] != d or not q.dtype == k.dtype == v.dtype)
    dtype = _DTYPES.index(q.dtype) if q.dtype in _DTYPES else -1
    mine = [problem, b, h, h_kv, d, d_v, dtype, int(causal), s_q, s_kv]
    rows = _gathered(pos, mine)
    bad = [r for r, row in enumerate(rows) if row[: len(_FIELDS)] != rows[0][: len(_FIELDS)]]
    if problem or any(row[0] for row in rows) or bad:
        raise ValueError(
            "K/V ring: every rank must pass q, k, v of one batch, head counts (K/V heads "
            "dividing q's), head sizes and dtype, and one causal flag; "
            f"per rank {[dict(zip(_FIELDS, row, strict=False)) for row in rows]}"
        )
    q_lens, kv_lens = tuple(r[-2] for r in rows), tuple(r[-1] for r in rows)
    if causal and (len(set(q_lens)) > 1 or q_lens != kv_lens or q_lens[0] % 2):
        raise ValueError(f"K/V ring, causal: zigzag shards of one even length; got {q_lens}")
    comms = comms_of(pos.group) if pos.size > 1 else None
    ring = Ring(pos=pos, comms=comms, q_lens=q_lens, settings=())
    pair = select_pair(kernel, q.device, q.dtype, d, d_v, False)
    if h_kv < h:
        pair = gqa_pair(pair, q.device, q.dtype, d, d_v)
    scale = softmax_scale if softmax_scale is not None else d**-0.5
    out, _ = kv_ring_attn(q, k, v, ring=ring, pair=pair, causal=causal, scale=scale,
                          layout=lay, kv_lens=kv_lens)  # fmt: skip
    return out


def _gathered(pos: RingPosition, mine: list[int]) -> list[list[int]]:
    """Every rank's row (the ring's CPU communicator, bounded by the ring's deadline)."""
    if pos.size == 1:
        return [mine]
    row = torch.tensor(mine, dtype=torch.int64)
    rows = [torch.empty_like(row) for _ in range(pos.size)]
    dist.all_gather(rows, row, group=comms_of(pos.group).check)
    return [r.tolist() for r in rows]
