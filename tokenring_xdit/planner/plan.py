"""Enumerate every ulysses x ring split and ring, predict each, rank them."""

from __future__ import annotations

from dataclasses import dataclass

from .cost import RINGS, Prediction
from .machine import Machine
from .workload import FORWARD, Workload, one_gpu_ms, split_prediction, why

__all__ = ["Choice", "splits", "rank_all", "reason", "xdit_flags", "diffusers_config"]


@dataclass
class Choice:
    prediction: Prediction
    per_step_ms: float  # attention only: layers x one call
    ceiling: float | None = None  # the ring part's kernel ceiling (None: no ring, not measured)
    efficiency: float | None = None  # (one-GPU time / GPUs) / predicted time

    @property
    def label(self) -> str:
        p = self.prediction
        ring = p.method if p.ring > 1 else "-"
        return f"ulysses {p.ulysses} x ring {p.ring} ({ring})"


def splits(heads: int, gpus: int, kv_heads: int | None = None) -> list[tuple[int, int]]:
    """(ulysses, ring) with ulysses x ring = gpus and ulysses dividing the (K/V) heads."""
    kv = kv_heads or heads
    return [
        (u, gpus // u)
        for u in range(1, gpus + 1)
        if gpus % u == 0 and heads % u == 0 and kv % u == 0
    ]


def rank_all(
    m: Machine,
    heads: int,
    head_dim: int,
    tokens: int,
    layers: int = 1,
    batch: int = 1,
    dtype: str = "bfloat16",
    rings: tuple[str, ...] = tuple(RINGS),
    kv_heads: int | None = None,
    workload: Workload = FORWARD,
) -> list[Choice]:
    """Every split and ring, fastest first. workload: the non-causal forward (simulated), or a
    causal and/or training call (workload.py: TokenRing and ulysses only)."""
    if not workload.simulated:
        rings = tuple(r for r in rings if r == "token_ring")
    single = one_gpu_ms(m, workload, heads * batch, head_dim, tokens)
    out = []
    for u, r in splits(heads, m.gpus, kv_heads):
        for method in rings if r > 1 else ("ulysses",):
            p, ceiling = split_prediction(
                m, workload, method, heads, head_dim, tokens, u, r, batch=batch, dtype=dtype,
                kv_heads=kv_heads,
            )  # fmt: skip
            eff = single / (u * r) / p.ms if p.ms > 0 else None
            out.append(Choice(p, p.ms * layers, ceiling, eff))
    return sorted(out, key=lambda c: c.prediction.ms)


def reason(choices: list[Choice], tokens: int, workload: Workload = FORWARD) -> str:
    """Why the first of `choices` (rank_all's order) is the pick, against the best of the other
    kind (ring splits vs plain ulysses)."""
    best = choices[0]
    p = best.prediction
    return why(best, choices[1:], workload, tokens, p.ulysses * p.ring)


def xdit_flags(c: Choice) -> str:
    p = c.prediction
    impl = "token_ring" if p.method == "token_ring" else "default"
    flags = f"--ulysses_degree {p.ulysses} --ring_degree {p.ring}"
    return flags + (f" --ring_impl_type {impl}" if p.ring > 1 else "")


def diffusers_config(c: Choice) -> str:
    p = c.prediction
    return f"ContextParallelConfig(ulysses_degree={p.ulysses}, ring_degree={p.ring})"
