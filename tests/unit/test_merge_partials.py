"""PartialMerge: merging per-key-block partials equals attention over all keys."""

from __future__ import annotations

import pytest
import torch

from tokenring_xdit.ring.kernels import math as math_kernel
from tokenring_xdit.ring.tensor_layout import BHSD, BSHD, Layout
from tokenring_xdit.ring.merge.partials import PartialMerge

LAYOUTS = [BSHD, BHSD]


def _make(layout: Layout, b, s_q, s_k, h, d, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, s_q, d, generator=gen, dtype=torch.float64)
    k = torch.randn(b, h, s_k, d, generator=gen, dtype=torch.float64)
    v = torch.randn(b, h, s_k, d, generator=gen, dtype=torch.float64)
    # from_bhsd is its own inverse; .contiguous() gives a dense tensor in `layout`
    return tuple(layout.from_bhsd(x).to(dtype).contiguous() for x in (q, k, v))


def _random_split(length: int, pieces: int, gen: torch.Generator) -> list[int]:
    cuts = sorted(torch.randperm(length - 1, generator=gen)[: pieces - 1].add(1).tolist())
    edges = [0, *cuts, length]
    return [e - s for s, e in zip(edges[:-1], edges[1:], strict=True)]


def _ref_scores(q, k, layout, scale):
    qb, kb = (layout.to_bhsd(x).double() for x in (q, k))
    return (qb @ kb.transpose(-1, -2)) * scale


def _check(out, lse, ref_out, ref_lse, what, tol=1e-6):
    """fp32 results vs the fp64 reference: |err| <= tol * (1 + |ref|), numbers in the message."""
    assert out.shape == ref_out.shape, (what, out.shape, ref_out.shape)
    assert lse.shape == ref_lse.shape, (what, lse.shape, ref_lse.shape)
    err_out = (out.double() - ref_out).abs().max().item()
    err_lse = (lse.double() - ref_lse).abs().max().item()
    torch.testing.assert_close(
        out.double(), ref_out, atol=tol, rtol=tol, msg=lambda m: f"{what}: out {err_out:.3g}\n{m}"
    )
    torch.testing.assert_close(
        lse.double(), ref_lse, atol=tol, rtol=tol, msg=lambda m: f"{what}: lse {err_lse:.3g}\n{m}"
    )


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.name)
@pytest.mark.parametrize("pieces", [1, 2, 3, 5])
@pytest.mark.parametrize("seed", [0, 1])
def test_merge_of_key_blocks_equals_full_attention(layout, pieces, seed, reference):
    b, s_q, s_k, h, d = 2, 13, 61, 3, 32
    q, k, v = _make(layout, b, s_q, s_k, h, d, seed=seed)
    scale = d**-0.5
    ref_out, ref_lse = reference.exact_attention(q, k, v, scale=scale, layout=layout.name)
    # the same full-key attention through the fp32 math kernel (no merge) agrees too
    full_out, full_lse = math_kernel(q, k, v, scale, layout)
    _check(full_out, full_lse, ref_out, ref_lse, f"{layout.name} unsplit math kernel")

    gen = torch.Generator().manual_seed(100 + seed)
    sizes = _random_split(s_k, pieces, gen)
    k_parts = torch.split(k, sizes, dim=layout.seq_dim)
    v_parts = torch.split(v, sizes, dim=layout.seq_dim)
    order = torch.randperm(pieces, generator=gen).tolist()  # merge order must not matter
    merge = None
    for i in order:
        block = math_kernel(q, k_parts[i], v_parts[i], scale, layout)
        if merge is None:
            merge = PartialMerge(*block, layout)
        else:
            merge.update(*block)
    out, lse = merge.result(torch.float32)
    assert out.dtype == torch.float32 and lse.shape == (b, h, s_q)
    _check(out, lse, ref_out, ref_lse, f"{layout.name} split {sizes} order {order}")


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.name)
def test_lse_equals_logsumexp_of_full_scores(layout):
    b, s_q, s_k, h, d = 1, 9, 40, 2, 16
    q, k, v = _make(layout, b, s_q, s_k, h, d, seed=3)
    scale = 0.37
    parts = [7, 20, 13]
    k_parts = torch.split(k, parts, layout.seq_dim)
    v_parts = torch.split(v, parts, layout.seq_dim)
    merge = PartialMerge(*math_kernel(q, k_parts[0], v_parts[0], scale, layout), layout)
    for kp, vp in zip(k_parts[1:], v_parts[1:], strict=True):
        merge.update(*math_kernel(q, kp, vp, scale, layout))
    _, lse = merge.result(torch.float32)
    ref = torch.logsumexp(_ref_scores(q, k, layout, scale), dim=-1)
    err = (lse.double() - ref).abs().max().item()
    assert lse.dtype == torch.float32
    assert err <= 1e-5, f"lse vs logsumexp(full scores): {err:.3g}"


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.name)
def test_seq_slice_updates_only_their_queries(layout, reference):
    """The final-chunk path: a partial covering queries [a, b) merges into that slice only."""
    b, s_q, s_k, h, d = 2, 17, 50, 2, 24
    q, k, v = _make(layout, b, s_q, s_k, h, d, seed=5)
    scale = d**-0.5
    ref_out, ref_lse = reference.exact_attention(q, k, v, scale=scale, layout=layout.name)
    split = 30
    k0, k1 = torch.split(k, [split, s_k - split], layout.seq_dim)
    v0, v1 = torch.split(v, [split, s_k - split], layout.seq_dim)
    merge = PartialMerge(*math_kernel(q, k0, v0, scale, layout), layout)
    first_out = merge.out.clone()
    first_lse = merge.lse.clone()
    bounds = [(0, 6), (6, 7), (7, 17)]  # uneven pieces, one of length 1
    for i, (s0, s1) in enumerate(bounds):
        q_piece = layout.seq_slice(q, slice(s0, s1))
        block = math_kernel(q_piece, k1, v1, scale, layout)
        merge.update(*block, seq=slice(s0, s1))
        # queries not covered yet still hold the first partial only
        rest = slice(s1, s_q)
        if s1 < s_q:
            assert torch.equal(layout.seq_slice(merge.out, rest), layout.seq_slice(first_out, rest))
            assert torch.equal(merge.lse[:, :, rest], first_lse[:, :, rest]), i
    out, lse = merge.result(torch.float32)
    _check(out, lse, ref_out, ref_lse, f"{layout.name} chunks {bounds}")


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.name)
def test_bf16_blocks_accumulate_in_fp32(layout, reference):
    b, s_q, s_k, h, d = 1, 11, 48, 2, 64
    q, k, v = _make(layout, b, s_q, s_k, h, d, dtype=torch.bfloat16, seed=7)
    scale = d**-0.5
    parts = [16, 16, 16]
    blocks = [
        math_kernel(q, kp, vp, scale, layout)
        for kp, vp in zip(
            torch.split(k, parts, layout.seq_dim),
            torch.split(v, parts, layout.seq_dim),
            strict=True,
        )
    ]
    assert blocks[0][0].dtype == torch.bfloat16 and blocks[0][1].dtype == torch.float32
    merge = PartialMerge(*blocks[0], layout)
    for blk in blocks[1:]:
        merge.update(*blk)
    assert merge.out.dtype == torch.float32 and merge.lse.dtype == torch.float32
    out, lse = merge.result(torch.bfloat16)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    out32, _ = merge.result(torch.float32)
    assert out32.dtype == torch.float32
    ref_out, ref_lse = reference.exact_attention(q, k, v, scale=scale, layout=layout.name)
    err_out = (out.double() - ref_out).abs().max().item()
    err_lse = (lse.double() - ref_lse).abs().max().item()
    assert err_out <= 2e-2, f"bf16 merged out vs fp64 reference: {err_out:.3g} > 2e-2"
    assert err_lse <= 1e-4, f"lse from bf16 blocks (fp32 kernel lse): {err_lse:.3g} > 1e-4"


def test_merge_does_not_alias_the_first_block():
    q, k, v = _make(BSHD, 1, 4, 8, 1, 8)
    block_out, block_lse = math_kernel(q, k, v, 1.0, BSHD)
    keep_out, keep_lse = block_out.clone(), block_lse.clone()
    merge = PartialMerge(block_out, block_lse, BSHD)
    merge.update(*math_kernel(q, k, v, 1.0, BSHD))
    assert torch.equal(block_out, keep_out) and torch.equal(block_lse, keep_lse)
    # the same keys twice: out unchanged, lse + log 2
    torch.testing.assert_close(merge.out, keep_out, rtol=0, atol=1e-6)
    torch.testing.assert_close(
        merge.lse, keep_lse + torch.log(torch.tensor(2.0)), rtol=0, atol=1e-6
    )


def test_merge_is_stable_for_far_apart_lse():
    """A block whose lse is far below the accumulator must leave it (numerically) unchanged."""
    out = torch.randn(1, 3, 1, 4)
    lse = torch.zeros(1, 1, 3)
    merge = PartialMerge(out, lse, BSHD)
    merge.update(torch.full((1, 3, 1, 4), 1e6), torch.full((1, 1, 3), -200.0))
    assert torch.isfinite(merge.out).all() and torch.isfinite(merge.lse).all()
    torch.testing.assert_close(merge.out, out, rtol=0, atol=1e-6)
    merge.update(torch.full((1, 3, 1, 4), 5.0), torch.full((1, 1, 3), 300.0))
    torch.testing.assert_close(merge.out, torch.full((1, 3, 1, 4), 5.0), rtol=0, atol=1e-6)
    torch.testing.assert_close(merge.lse, torch.full((1, 1, 3), 300.0), rtol=0, atol=1e-4)
