"""The shared exact reference (tests/reference.py) is itself right: its fp64 attention equals a
softmax written out by hand, its gradients autograd's, its zigzag slice the product's positions."""

from __future__ import annotations

import pytest
import torch

from tokenring_xdit.ring.split.sharding import zigzag_positions


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_exact_attention_is_a_written_out_softmax(reference, causal, layout):
    gen = torch.Generator().manual_seed(3)
    b, s, h, hk, d = 2, 9, 4, 2, 8  # GQA: query head i uses K/V head i // 2
    q = torch.randn(b, h, s, d, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(b, hk, s, d, generator=gen, dtype=torch.float64) for _ in "kv")
    scores = q @ k.repeat_interleave(2, 1).transpose(-1, -2) * 0.3
    if causal:
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    want = torch.softmax(scores, -1) @ v.repeat_interleave(2, 1)
    to = (lambda x: x.transpose(1, 2)) if layout == "bshd" else (lambda x: x)
    out, lse = reference.exact_attention(
        to(q), to(k), to(v), causal=causal, scale=0.3, layout=layout
    )
    assert out.dtype == torch.float64 and lse.shape == (b, h, s)
    assert reference.max_err(out, to(want)) < 1e-12
    assert reference.max_err(lse, torch.logsumexp(scores, -1)) < 1e-12
    grads = reference.exact_grads(to(q), to(k), to(v), to(want), causal=causal, scale=0.3,
                                  layout=layout)  # fmt: skip
    assert reference.max_err(grads[0], out) == 0.0 and grads[2].shape == to(k).shape


def test_zigzag_slice_is_the_products_zigzag_shard(reference):
    x = torch.arange(2 * 16).reshape(2, 16)
    for rank in range(4):
        got = reference.zigzag_slice(x, rank, 4, dim=1)
        assert torch.equal(got, x[:, zigzag_positions(16, rank, 4)])
    assert torch.equal(reference.contiguous_slice(x, [5, 11], 1), x[:, 5:])
