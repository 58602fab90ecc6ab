"""`flash_varlen`: torch's flash kernel with cu_seqlens (`aten._flash_attention_forward` /
`_backward`, CUDA, fp16/bf16) for packed documents: one call per run of abutting segments (the
diagonal block is one call; an off-diagonal zigzag block meets at most one document: a dense
call on a slice). Query rows that meet no segment get out = 0 and lse = -inf. A plain bool mask
means "no documents" and runs torch's dense flash op. A window's banded segment (segments.py)
is one call with flash's own window arguments (bottom-right aligned, so the band is said from
the segment's last row; the window plan has cut the segment to the rows and columns that see
something, which keeps both sides >= 0)."""

from __future__ import annotations

import torch

from ...caches import Lru
from ..graph_cache import keep_alive
from ..segments import Segment, segment_runs
from ..tensor_layout import BHSD, Layout
from .base import Kernel, RowsSeen, empty_partial, merge_rows
from .sdpa import flash_backward, flash_forward, no_rng
from .standin import out_standin_bhsd


def _rows(x: torch.Tensor, i: int, sl: slice, layout: Layout) -> torch.Tensor:
    """Batch row i, positions sl, as the (n, h, d) view flash's varlen entry takes."""
    return x[i, sl] if layout.seq_dim == 1 else x[i, :, sl].transpose(0, 1)


# (offsets, device) -> the offsets on that device, the last 1024. Offsets come from the agreed
# documents, so a packed batch reuses them every layer and call.
_OFFSETS = Lru(1024)


def _device_offsets(offsets: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """`offsets` as int32 on `device`, never blocking the host: a plain host-to-device copy
    waits for the stream, and inside a ring call the stream waits on the ring's transfers, so
    a peer that died would hold the host there, before the call reaches its deadline's watch
    (measured on 2 x H200). Pinned memory and a non-blocking copy only queue."""
    key = (offsets, device)
    hit = _OFFSETS.get(key)
    if hit is not None:  # no CUDA query on this path (every varlen call of every layer)
        keep_alive(hit)  # in our capture: this cache may let it go while the graph reads it
        return hit
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    host = torch.tensor(offsets, dtype=torch.int32)
    if device.type == "cuda":
        host = host.pin_memory()  # the caching host allocator keeps it until the copy ends
    hit = host.to(device, non_blocking=True)
    if capturing:
        # captured, the copy reads the pinned buffer at every replay: the graph keeps both
        # (the call's eager run before its capture has normally cached the offsets already)
        keep_alive(host, hit)
        return hit
    _OFFSETS.put(key, hit)
    return hit


def _cu(group: list[Segment], side: str, device) -> tuple[torch.Tensor, int]:
    starts = [getattr(s, side + "0") for s in group]
    ends = [getattr(s, side + "1") for s in group]
    offsets = tuple(a - starts[0] for a in starts) + (ends[-1] - starts[0],)
    longest = max(b - a for a, b in zip(starts, ends, strict=True))
    return _device_offsets(offsets, torch.device(device)), longest


def _window(group: list[Segment]) -> dict:
    """flash's window arguments for a run (a banded segment is a run of its own): key b is
    visible to query a iff a + (n_k - n_q) - left <= b <= a + (n_k - n_q) + right."""
    band = group[0].band
    if band is None:
        return {}
    lo, hi = band
    s = group[0]
    n_q, n_k = s.q1 - s.q0, s.k1 - s.k0
    left = -1 if hi is None else n_k - n_q + hi
    right = -1 if lo is None else n_q - n_k - lo
    if min(left, right) < -1 or (left == -1 and hi is not None) or (right == -1 and lo is not None):
        raise ValueError(f"a banded segment not cut to its visible pairs: {s}")
    return {"window_size_left": left, "window_size_right": right}


def _forward(q, k, v, scale, layout: Layout, mask):
    if isinstance(mask, bool):
        return flash_forward(q, k, v, scale, layout, mask)
    out, lse = empty_partial(q, v, layout)
    seen = RowsSeen(q.shape[layout.seq_dim])
    for grp in segment_runs(mask):
        qs, ks = slice(grp[0].q0, grp[-1].q1), slice(grp[0].k0, grp[-1].k1)
        (cu_q, max_q), (cu_k, max_k) = _cu(grp, "q", q.device), _cu(grp, "k", q.device)
        first, window = seen.first(qs.start, qs.stop), _window(grp)
        for i in range(q.shape[0]):
            o, block_lse = torch.ops.aten._flash_attention_forward(
                _rows(q, i, qs, layout), _rows(k, i, ks, layout), _rows(v, i, ks, layout),
                cu_q, cu_k, max_q, max_k, 0.0, grp[0].causal, False, scale=scale, **window,
            )[:2]  # fmt: skip
            # flash's varlen lse is (h, total_q)
            block_lse = block_lse.reshape(block_lse.shape[-2], -1)[:, : qs.stop - qs.start]
            if window:  # flash says +inf for a row that sees no key (a band's): nothing, -inf
                block_lse = block_lse.masked_fill(block_lse == float("inf"), float("-inf"))
            if first:
                _rows(out, i, qs, layout).copy_(o)
                lse[i, :, qs] = block_lse
            else:  # the same queries against a second run of keys (documents layout)
                rows = lse[i, :, qs]
                merge_rows(_rows(out, i, qs, layout), rows, o, block_lse.float(), _lse_rows)
    return out, lse


def _lse_rows(lse: torch.Tensor) -> torch.Tensor:
    """An (h, n) lse as (n, h, 1), against the (n, h, d) rows of flash's varlen entry."""
    return lse.transpose(0, 1).unsqueeze(-1)


def _backward(dout, q, k, v, out, lse, delta, scale, layout: Layout, mask):
    if isinstance(mask, bool):
        return flash_backward(dout, q, k, v, out, lse, delta, scale, layout, mask)
    dq, dk, dv = (torch.zeros_like(x) for x in (q, k, v))
    dob = layout.to_bhsd(dout)
    ob = layout.to_bhsd(out) if out is not None else out_standin_bhsd(dob, delta)
    rng = no_rng(q.device)
    for grp in segment_runs(mask):
        qs, ks = slice(grp[0].q0, grp[-1].q1), slice(grp[0].k0, grp[-1].k1)
        (cu_q, max_q), (cu_k, max_k) = _cu(grp, "q", q.device), _cu(grp, "k", q.device)
        window = _window(grp)
        for i in range(q.shape[0]):
            grads = torch.ops.aten._flash_attention_backward(
                _rows(dob, i, qs, BHSD), _rows(q, i, qs, layout), _rows(k, i, ks, layout),
                _rows(v, i, ks, layout), _rows(ob, i, qs, BHSD), lse[i, :, qs].contiguous(),
                cu_q, cu_k, max_q, max_k, 0.0, grp[0].causal, rng, rng, scale=scale, **window,
            )  # fmt: skip
            for g, x, sl in zip(grads, (dq, dk, dv), (qs, ks, ks), strict=True):
                _rows(x, i, sl, layout).add_(g)
    return dq, dk, dv


FLASH_VARLEN = Kernel(
    "flash_varlen", _forward, _backward, False, half_only=True, segments=True, bands=True
)
