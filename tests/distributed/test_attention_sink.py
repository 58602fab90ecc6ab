"""Attention sinks (a per-head logit every query also attends, GPT-OSS's `sinks`) after the ring.

`add_attention_sink` takes the ring's merged (out, lse) and the sinks; out, lse and the
gradients of q, k, v and the sinks must equal attention with the sink over the whole sequence in
float64 (the sink as an extra key column with no value). Rings of 1-3 gloo ranks, causal zigzag
and non-causal, MHA and GQA; the gradient of lse reaches the ring's backward (fold_lse_grad).
The cases of one ring size share a launch (tests/harness.py run_cases).
"""

from __future__ import annotations

import functools

import pytest
import torch

from tests.harness import run_cases

TOL = 1e-6  # fp64 inputs; the backward's delta is fp32 per row


def _exact_with_sink(q, k, v, sinks, causal):
    """(out, lse) fp64 of (b, h, s, d) inputs over the whole sequence with a sink column."""
    g = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(g, dim=1) for x in (k, v))
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    sink = sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    full = torch.cat([scores, sink], dim=-1)
    probs = full.softmax(-1)[..., :-1]
    return probs @ v, torch.logsumexp(full, dim=-1)


def _worker(rank: int, n: int, group, case: str) -> dict:
    import torch.distributed as dist

    causal, heads, kv_heads = _parse(case)
    from tokenring_xdit.ring import add_attention_sink, token_ring_attn_func
    from tokenring_xdit.ring.split.sharding import shard_positions

    total, d = 8 * n, 16
    gen = torch.Generator().manual_seed(7 + n + heads + kv_heads + causal)
    shapes = [(1, heads, total, d), (1, kv_heads, total, d), (1, kv_heads, total, d)]
    q, k, v = (torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes)
    do = torch.randn(1, heads, total, d, generator=gen, dtype=torch.float64)
    sinks = torch.randn(heads, generator=gen, dtype=torch.float64)
    ref_in = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
    ref_out, ref_lse = _exact_with_sink(*ref_in, causal)
    ref_out.backward(do)

    pos = shard_positions(total, rank, n, causal=causal)
    ql, kl, vl = (x[:, :, pos].transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    sl = sinks.clone().requires_grad_()
    out, lse, _ = token_ring_attn_func(
        ql, kl, vl, causal=causal, positions=pos if causal else None, kernel="math",
        return_attn_probs=True, group=group,
    )  # fmt: skip
    out, lse = add_attention_sink(out, lse, sl, layout="bshd")
    out.backward(do[:, :, pos].transpose(1, 2))
    dsinks = sl.grad.clone()
    if n > 1:
        dist.all_reduce(dsinks, group=group)  # each rank's rows' share

    def err(got, want):
        return (got.double() - want.double()).abs().max().item()

    local = lambda x: x[:, :, pos].transpose(1, 2)  # noqa: E731
    return {
        "out": err(out, local(ref_out)),
        "lse": err(lse, ref_lse[:, :, pos]),
        "dq": err(ql.grad, local(ref_in[0].grad)),
        "dk": err(kl.grad, local(ref_in[1].grad)),
        "dv": err(vl.grad, local(ref_in[2].grad)),
        "dsinks": err(dsinks, ref_in[3].grad),
        "sink_matters": err(ref_in[3].grad, torch.zeros_like(sinks)),
    }


# ring size, causal, query heads, K/V heads
CASES = [(1, True, 4, 2), (2, True, 4, 4), (2, False, 4, 2), (3, True, 4, 2), (3, False, 4, 4)]


def _name(causal: bool, heads: int, kv_heads: int) -> str:
    return f"{'causal' if causal else 'noncausal'}-{heads}-{kv_heads}"


def _parse(case: str) -> tuple[bool, int, int]:
    kind, heads, kv_heads = case.split("-")
    return kind == "causal", int(heads), int(kv_heads)


@functools.cache
def _ring(n: int) -> dict:
    """Every case of ring size n from one launch: {case name: [RankResult per rank]}."""
    return run_cases(_worker, n, [_name(*c[1:]) for c in CASES if c[0] == n])


@pytest.mark.parametrize("n,causal,heads,kv_heads", CASES)
def test_sink_after_the_ring_equals_exact_attention_with_a_sink(n, causal, heads, kv_heads):
    for r in _ring(n)[_name(causal, heads, kv_heads)]:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.error}\n{r.trace}"
        rank, errs = r.rank, dict(r.value)
        assert errs.pop("sink_matters") > 1e-3, "the case must exercise the sink's gradient"
        worst = {k: e for k, e in errs.items() if not e <= TOL}
        assert not worst, f"rank {rank} of {n}: {worst} (all: {errs})"


def test_a_sink_of_the_wrong_shape_is_refused():
    from tokenring_xdit.ring import add_attention_sink

    out, lse = torch.zeros(1, 5, 4, 8), torch.zeros(1, 4, 5)
    with pytest.raises(ValueError, match=r"one logit per query head, shape \(4,\)"):
        add_attention_sink(out, lse, torch.zeros(3))
