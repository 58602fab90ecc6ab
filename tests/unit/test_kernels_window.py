"""A windowed call's kernels: the band reaches the masked kernel and flash's window arguments
exactly; `window_pair` routes each block's mask to the kernel for it."""

from __future__ import annotations

import random

import pytest
import torch

from tokenring_xdit.ring.kernels import MASKED, PAIRS, segments_mask, segments_pair, window_pair
from tokenring_xdit.ring.kernels.base import row_delta
from tokenring_xdit.ring.kernels.probe import works
from tokenring_xdit.ring.kernels.varlen import _window
from tokenring_xdit.ring.kernels.registry import DOC_REGISTRY
from tokenring_xdit.ring.kernels.window import banded, runs_block
from tokenring_xdit.ring.kernels.wrappers import expanded
from tokenring_xdit.ring.packed.window_plan import _trim
from tokenring_xdit.ring.segments import Segment
from tokenring_xdit.ring.tensor_layout import BHSD

CPU = torch.device("cpu")


def test_flash_window_arguments_match_the_band():
    """flash's bottom-right aligned window on a cut segment sees exactly the band's pairs."""
    rng = random.Random(0)
    for _ in range(3000):
        n_q, n_k = rng.randint(1, 10), rng.randint(1, 10)
        lo, hi = (rng.choice([None, *range(-12, 12)]) for _ in "lh")
        seg = Segment(0, n_q, 0, n_k, False, (lo, hi))
        want = segments_mask((seg,), n_q, n_k, "cpu")
        if not want.any() or (lo is not None and hi is not None and lo > hi):
            continue
        cut = _trim(seg)
        args = _window([cut])
        left, right = args["window_size_left"], args["window_size_right"]
        a = torch.arange(cut.q1 - cut.q0)[:, None]
        b = torch.arange(cut.k1 - cut.k0)[None, :]
        shift = (cut.k1 - cut.k0) - (cut.q1 - cut.q0)
        got = torch.ones_like(a - b, dtype=torch.bool)
        if left >= 0:
            got &= b >= a + shift - left
        if right >= 0:
            got &= b <= a + shift + right
        full = torch.zeros(n_q, n_k, dtype=torch.bool)
        full[cut.q0 : cut.q1, cut.k0 : cut.k1] = got
        assert torch.equal(full, want), (seg, cut, args)


def _run(record, mask, s=24, h=2, h_kv=2, d=8, dtype=torch.float64):
    gen = torch.Generator().manual_seed(0)
    q, do = (torch.randn(1, h, s, d, generator=gen).to(dtype) for _ in "qo")
    k, v = (torch.randn(1, h_kv, s, d, generator=gen).to(dtype) for _ in "kv")
    out, lse = record.run_forward(q, k, v, d**-0.5, BHSD, mask)
    delta = row_delta(do, out, BHSD)
    grads = record.run_backward(do, q, k, v, None, lse, delta, d**-0.5, BHSD, mask)
    return [out, lse, *grads]


def test_masked_kernel_takes_bands_like_a_dense_mask():
    """The band in a segment equals the same pairs given as a causal flag where they are one."""
    band = (Segment(0, 24, 0, 24, False, (0, None)),)  # the causal triangle as a band
    for got, want in zip(_run(MASKED, band), _run(MASKED, True), strict=True):
        torch.testing.assert_close(got, want)
    assert works(MASKED, "bands", CPU, torch.float32, 8, 8)


def test_window_pair_routes_blocks():
    """A causal flag goes to the call's kernel, banded or plain segments to the band kernel,
    plain segments of a packed kernel to that kernel."""
    dense, f32 = PAIRS["cpu_flash"], torch.float32
    pair = window_pair(dense, CPU, f32, 8, 8)
    assert pair.bands and pair.segments and pair.name.startswith("cpu_flash+window")
    band = (Segment(0, 24, 0, 24, False, (0, 5)), Segment(3, 9, 12, 20, False))
    for got, want in zip(_run(pair, band, dtype=f32), _run(MASKED, band, dtype=f32), strict=True):
        assert torch.equal(got, want)  # the same kernel ran
    for got, want in zip(_run(pair, True, dtype=f32), _run(dense, True, dtype=f32), strict=True):
        assert torch.equal(got, want)
    assert window_pair(MASKED, CPU, torch.float64, 8, 8) is MASKED
    packed = segments_pair(dense)
    assert window_pair(packed, CPU, torch.float64, 8, 8).forward.dense is packed


def test_window_pair_gqa_expands_for_bands():
    pair = window_pair(PAIRS["cpu_flash"], CPU, torch.float64, 8, 8)
    band = (Segment(0, 24, 0, 24, False, (0, 3)),)
    got = _run(pair, band, h=4, h_kv=2)
    assert got[3].shape[1] == 2 and got[4].shape[1] == 2  # dK, dV folded to the K/V heads


def test_band_kernel_reads_grouped_kv_where_the_probe_says_it_takes_them():
    """"gqa-bands" decides: a band kernel that takes fewer K/V heads itself runs on them (no
    copy of a whole tile's K/V per block), one that does not gets them expanded per block."""
    assert not works(MASKED, "gqa-bands", CPU, torch.float64, 8, 8)  # 4 heads against 2: no
    grouped = expanded(MASKED)  # takes them (by expanding itself)
    assert works(grouped, "gqa-bands", CPU, torch.float64, 8, 8)
    assert banded(PAIRS["cpu_flash"], grouped, True).forward.band is grouped
    assert banded(PAIRS["cpu_flash"], MASKED).forward.band == expanded(MASKED)


def test_flash_varlen_keeps_its_tall_bands_off_flash():
    """flash_varlen takes bands itself, but a banded segment taller than wide goes to the exact
    masked kernel (flash's window got those wrong on H200): its windowed record routes them."""
    flash = DOC_REGISTRY["flash_varlen"]
    pair = window_pair(flash, CPU, torch.bfloat16, 64, 64)
    tall, wide = Segment(0, 40, 0, 20, False, (0, 7)), Segment(0, 20, 0, 40, False, (-9, 0))
    assert runs_block(pair, (tall,)).name == "masked"
    assert runs_block(pair, (wide,)).name == "flash_varlen"
    assert runs_block(pair, True) is flash and runs_block(pair, (Segment(0, 8, 0, 8, True),)) is flash


def test_dense_kernel_per_segment_refuses_a_band():
    with pytest.raises(NotImplementedError, match="band"):
        _run(segments_pair(PAIRS["cpu_flash"]), (Segment(0, 24, 0, 24, False, (0, 3)),))
