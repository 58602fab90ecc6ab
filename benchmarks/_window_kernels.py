"""Sliding-window attention on one GPU, kernel by kernel, for benchmarks/ceiling.py's window rows:
one banded rectangle (the whole sequence under a causal window, or one banded segment of a window
plan) timed on every window-capable kernel that runs here.

Kernels (`KERNELS`):
  flash_varlen      torch's flash op with its window arguments (kernels/varlen.py), K/V expanded
                    to the query's heads where there are fewer (how the ring ran its bands
                    before the "gqa-bands" probe let it read grouped K/V);
  flash_varlen_gqa  the same op reading grouped K/V itself (only where K/V heads are fewer; an
                    error is recorded where torch's op refuses them): how the ring runs its
                    bands where the probe passes (kernels/window.py `banded`);
  masked            the exact kernel (kernels/exact.py, K/V expanded): dense fp32 scores of the
                    rectangle, so only where heads x rows x columns stay under `masked_limit`;
  flex              torch's flex_attention (compiled on CUDA, eager elsewhere) with a block mask
                    made from the band itself (`band_block_mask`: no dense mask at any length).

A rectangle is `n_q` x `n_k` with the band (lo, hi): row a sees column b iff lo <= a - b <= hi
(ring/segments.py's banded `Segment`, None: unbounded). A result is ms, or a "skipped: ..." /
"error: ..." string saying why there is none.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

KERNELS = ("flash_varlen", "flash_varlen_gqa", "masked", "flex")
FLEX_BLOCK = 128  # flex_attention's default tile edge
Band = tuple[int | None, int | None]


def band_block_mask(n_q: int, n_k: int, band: Band, device, block: int = FLEX_BLOCK):
    """flex's BlockMask of an n_q x n_k rectangle with `band`, made from the band: per query
    tile the key tiles holding a visible pair (whole ones "full": flex skips the mask there),
    O(tiles^2) integers, never the dense (n_q, n_k) mask create_block_mask builds eagerly."""
    from torch.nn.attention.flex_attention import BlockMask

    lo, hi = band
    q_first = torch.arange(0, n_q, block, device=device)
    q_last = torch.clamp(q_first + block, max=n_q) - 1
    k_first = torch.arange(0, n_k, block, device=device)
    k_last = torch.clamp(k_first + block, max=n_k) - 1
    # the columns a query tile sees are one range (each row's range is the last one's shifted)
    c0 = (q_first - hi).clamp(min=0) if hi is not None else torch.zeros_like(q_first)
    c1 = (q_last - lo).clamp(max=n_k - 1) if lo is not None else torch.full_like(q_first, n_k - 1)
    touched = (k_last[None] >= c0[:, None]) & (k_first[None] <= c1[:, None])
    d_min, d_max = q_first[:, None] - k_last[None], q_last[:, None] - k_first[None]
    whole = ((q_last - q_first + 1) == block)[:, None] & ((k_last - k_first + 1) == block)[None]
    full = touched & whole
    if lo is not None:
        full &= d_min >= lo
    if hi is not None:
        full &= d_max <= hi
    partial = touched & ~full

    def table(sel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        order = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True)  # selected first
        return sel.sum(-1).to(torch.int32)[None, None], order.to(torch.int32)[None, None]

    def mask_mod(b, h, q_idx, kv_idx):
        d = q_idx - kv_idx
        keep = d == d
        if lo is not None:
            keep = keep & (d >= lo)
        if hi is not None:
            keep = keep & (d <= hi)
        return keep

    (num, idx), (full_num, full_idx) = table(partial), table(full)
    return BlockMask.from_kv_blocks(num, idx, full_num, full_idx, BLOCK_SIZE=block,
                                    mask_mod=mask_mod, seq_lengths=(n_q, n_k))  # fmt: skip


@functools.cache
def _flex(compiled: bool) -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention) if compiled else flex_attention


def _record(name: str):
    from tokenring_xdit.ring.kernels import wrappers
    from tokenring_xdit.ring.kernels.exact import MASKED
    from tokenring_xdit.ring.kernels.varlen import FLASH_VARLEN

    if name == "flash_varlen_gqa":
        return FLASH_VARLEN
    return wrappers.expanded(FLASH_VARLEN if name == "flash_varlen" else MASKED)


class Rect:
    """One banded rectangle's tensors (BSHD; flex's BHSD views of them) and its run per kernel."""

    def __init__(self, n_q: int, n_k: int, band: Band, heads: int, kv_heads: int,
                 head_dim: int, train: bool, dtype: torch.dtype, device) -> None:  # fmt: skip
        from tokenring_xdit.ring.segments import Segment

        gen = torch.Generator(device=device).manual_seed(n_q + n_k)

        def rand(n: int, h: int) -> torch.Tensor:
            return torch.randn(1, n, h, head_dim, generator=gen, device=device).to(dtype)

        self.q, self.k, self.v = rand(n_q, heads), rand(n_k, kv_heads), rand(n_k, kv_heads)
        self.do = rand(n_q, heads) if train else None
        self.mask = (Segment(0, n_q, 0, n_k, False, band),)
        self.band, self.train, self.scale = band, train, head_dim**-0.5

    def run_of(self, name: str) -> Callable[[], object]:
        """A zero-argument run of kernel `name` (forward, then backward when training)."""
        if name == "flex":
            return self._flex_run()
        from tokenring_xdit.ring.tensor_layout import BSHD

        record, (q, k, v), scale, mask = (
            _record(name),
            (self.q, self.k, self.v),
            self.scale,
            self.mask,
        )

        def run() -> None:
            out, lse = record.run_forward(q, k, v, scale, BSHD, mask)
            if self.train:
                lse = lse.float().contiguous()
                record.run_backward(self.do, q, k, v, out, lse, None, scale, BSHD, mask)

        return run

    def _flex_run(self) -> Callable[[], object]:
        qb, kb, vb = (x.transpose(1, 2).contiguous() for x in (self.q, self.k, self.v))
        block_mask = band_block_mask(qb.shape[2], kb.shape[2], self.band, qb.device)
        flex = _flex(qb.device.type == "cuda")
        gqa, scale = qb.shape[1] != kb.shape[1], self.scale
        if self.train:
            for x in (qb, kb, vb):
                x.requires_grad_(True)
            dob = self.do.transpose(1, 2).contiguous()

        def run() -> None:
            out = flex(qb, kb, vb, block_mask=block_mask, scale=scale, enable_gqa=gqa)
            if self.train:  # grads returned, not accumulated into .grad across runs
                torch.autograd.grad(out, (qb, kb, vb), dob)

        return run


def skip_reason(name: str, n_q: int, n_k: int, heads: int, kv_heads: int, device,
                masked_limit: float) -> str | None:  # fmt: skip
    """Why kernel `name` is not timed on this rectangle here (None: it is)."""
    device = torch.device(device)
    if name.startswith("flash_varlen") and device.type != "cuda":
        return "skipped: torch's flash op runs on CUDA only"
    if name == "flash_varlen_gqa" and kv_heads == heads:
        return "skipped: as many K/V heads as query heads (flash_varlen is the same)"
    if name == "masked" and heads * n_q * n_k > masked_limit:
        return f"skipped: dense scores of {heads} x {n_q} x {n_k} over --masked-limit"
    if name == "flex":
        try:
            from torch.nn.attention import flex_attention  # noqa: F401
        except ImportError as exc:
            return f"skipped: no flex_attention ({exc})"
    return None


def rect_ms(
    n_q: int, n_k: int, band: Band, heads: int, kv_heads: int, head_dim: int, *, train: bool,
    dtype: torch.dtype, device, kernels: tuple[str, ...], timed: Callable[[Callable], float],
    masked_limit: float = 2**27,
) -> dict[str, float | str]:  # fmt: skip
    """{kernel: ms or why not} of one n_q x n_k rectangle with `band`, forward (train: forward
    + backward). timed(fn) -> ms (the caller's warm-up and budget); flex is run once before
    it (its compile) and its compile seconds recorded as `flex_first_s`."""
    import time

    rect, out = None, {}
    for name in kernels:
        why = skip_reason(name, n_q, n_k, heads, kv_heads, device, masked_limit)
        if why is not None:
            out[name] = why
            continue
        try:
            if rect is None:
                rect = Rect(n_q, n_k, band, heads, kv_heads, head_dim, train, dtype, device)
            run = rect.run_of(name)
            if name == "flex":
                start = time.perf_counter()
                run()
                _sync(device)
                out["flex_first_s"] = round(time.perf_counter() - start, 3)
            out[name] = timed(run)
        except Exception as exc:  # noqa: BLE001 (a kernel failing here is recorded, the sweep goes on)
            out[name] = f"error: {str(exc).splitlines()[0][:200]}"
            _free(device)
    return out


def fastest(times: dict[str, float | str]) -> tuple[str, float] | None:
    """(kernel, ms) of the fastest kernel timed, None when none was."""
    ok = [(k, v) for k, v in times.items() if k in KERNELS and isinstance(v, float)]
    return min(ok, key=lambda kv: kv[1]) if ok else None


def bytes_needed(n_q: int, n_k: int, heads: int, head_dim: int, train: bool, dtype) -> int:
    """A rough upper bound of one rectangle's memory: Q and O (dO, dQ) at the query heads, K/V
    expanded to them (their grads too, and folded in fp32), with a quarter more for slack."""
    e = torch.tensor([], dtype=dtype).element_size()
    q_side = n_q * heads * head_dim * e * (4 if train else 2)
    k_side = n_k * heads * head_dim * (2 * e + (2 * e + 8 if train else 0))
    return math.ceil(1.25 * (q_side + k_side))


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _free(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
