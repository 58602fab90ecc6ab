"""The exact reference every correctness test compares with, written once.

Attention over the WHOLE sequence in float64, in one process (SDPA's math on float64 inputs), its
log-sum-exp, and its gradients by autograd; the zigzag slicing of a global tensor to one rank's
shard. Distributed workers import it (they run in other processes); pytest tests take it
through the `reference` fixture (tests/conftest.py). Inputs in (b, s, h, d) ("bshd") or
(b, h, s, d) ("bhsd"); K/V may have fewer heads (GQA: query head i uses K/V head i // g).
"""

from __future__ import annotations

import torch

__all__ = ["exact_attention", "exact_grads", "zigzag_slice", "contiguous_slice", "max_err"]


def _bhsd(x: torch.Tensor, layout: str) -> torch.Tensor:
    return x.transpose(1, 2) if layout == "bshd" else x


def exact_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    layout: str = "bshd",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out in `layout`, lse (b, h, s_q)), both float64, of attention over all of k/v.
    causal: top-left aligned (query i sees keys 0..i), as SDPA's is_causal."""
    qb, kb, vb = (_bhsd(x, layout).double() for x in (q, k, v))
    g = qb.shape[1] // kb.shape[1]
    kb, vb = (x.repeat_interleave(g, dim=1) for x in (kb, vb))
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    out = torch.nn.functional.scaled_dot_product_attention(
        qb, kb, vb, is_causal=causal, scale=scale
    )
    scores = (qb @ kb.transpose(-1, -2)) * scale
    if causal:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return _bhsd(out, layout), torch.logsumexp(scores, dim=-1)


def exact_grads(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    do: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    layout: str = "bshd",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, dq, dk, dv), float64, in `layout`: the exact forward and autograd's backward of
    `do` through it."""
    xs = [x.detach().double().requires_grad_() for x in (q, k, v)]
    out, _ = exact_attention(*xs, causal=causal, scale=scale, layout=layout)
    out.backward(do.double())
    return out.detach(), xs[0].grad, xs[1].grad, xs[2].grad


def zigzag_slice(x: torch.Tensor, rank: int, world_size: int, dim: int = 1) -> torch.Tensor:
    """Rank `rank`'s zigzag shard of a global tensor: chunks r and 2N-1-r of 2N along `dim`."""
    chunks = x.chunk(2 * world_size, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * world_size - 1 - rank]], dim=dim)


def contiguous_slice(x: torch.Tensor, lens: list[int], rank: int, dim: int = 1) -> torch.Tensor:
    """Rank `rank`'s contiguous shard when ranks hold `lens` tokens each, in rank order."""
    start = sum(lens[:rank])
    return x.narrow(dim, start, lens[rank])


def max_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| in float64 (0.0 for empty tensors)."""
    if not got.numel():
        return 0.0
    return (got.double() - want.double()).abs().max().item()


def case_failures(n: int, results: list, cases: list, fp32_tol: float, bf16_tol: dict) -> list[str]:
    """Every rank's cases of one launch whose errors pass their bound ({"errs", "dtype_ok"} per
    case name): one line per failure, naming the ring size, rank, case and what."""
    failures = []
    for rank, res in enumerate(results):
        for case in cases:
            got = res["cases"][case["name"]]
            if not got["dtype_ok"]:
                failures.append(f"N={n} rank {rank} {case['name']}: output dtype")
            for what, err in got["errs"].items():
                tol = fp32_tol if case["dtype"] == "float32" else bf16_tol[what]
                if not err <= tol:
                    failures.append(f"N={n} rank {rank} {case['name']} {what}: {err:.3g} > {tol}")
    return failures
