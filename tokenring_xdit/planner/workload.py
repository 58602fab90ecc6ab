"""Training and causal calls: each split's predicted efficiency, bounded by the ring's kernel
ceiling, and why the best one wins.

The step-by-step simulation (schedules.py) models the non-causal forward. For a causal call or
forward + backward a split is predicted from it and from the kernel ceiling (ceiling.py):

  one GPU    the forward's whole-sequence kernel time x W, W = TRAIN_OVER_FORWARD (fwd+bwd)
             x CAUSAL_OVER_FULL (causal), both measured on one H200
  ulysses    its forward kernel (h/U heads, whole sequence) x W + its all-to-alls x A
             (A = 2 with the backward: dO in, dQ/dK/dV out move the bytes of q, k, v, out again)
  ring R     one GPU / R / (ring's kernel ceiling for this mask and pass), plus what the
             simulated eager forward spends beyond its own kernels at their ceiling (transfers
             not hidden, merges) x A, plus the ulysses all-to-alls x A of a U x R split

Efficiency = (one-GPU time / GPUs) / predicted time. The ceiling is an upper bound no ring
schedule passes with these kernels, so where ulysses' predicted efficiency is above it the ring
cannot win and the reason says so. K/V rings other than TokenRing are not modelled here.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ceiling import CAUSAL_OVER_FULL, TRAIN_OVER_FORWARD, kernel_ceiling
from .cost import Prediction, predict
from .machine import Machine

__all__ = ["Workload", "FORWARD", "split_prediction", "one_gpu_ms", "why"]


@dataclass(frozen=True)
class Workload:
    causal: bool = False
    train: bool = False

    @property
    def mask(self) -> str:
        return "causal" if self.causal else "full"

    @property
    def pass_(self) -> str:
        return "fwd+bwd" if self.train else "fwd"

    @property
    def simulated(self) -> bool:
        """The non-causal forward: predicted by the simulation itself."""
        return not (self.causal or self.train)

    @property
    def kernel_factor(self) -> float:
        return (TRAIN_OVER_FORWARD if self.train else 1.0) * (
            CAUSAL_OVER_FULL if self.causal else 1.0
        )

    @property
    def label(self) -> str:
        return f"{self.mask} {self.pass_}"


FORWARD = Workload()


def one_gpu_ms(m: Machine, w: Workload, heads: int, head_dim: int, tokens: int) -> float:
    """The whole sequence on one GPU (heads: all of them, batch folded in)."""
    return m.table.block_ms(tokens, tokens, heads, head_dim) * w.kernel_factor


def ring_ceiling(
    m: Machine, w: Workload, ring: int, tokens: int, heads: int, kv_heads: int, head_dim: int
) -> tuple[float | None, str]:
    """The kernel ceiling of the ring part of a split (heads per ring rank, after ulysses)."""
    c, where = kernel_ceiling(w.mask, w.pass_, ring, tokens, heads, kv_heads, head_dim, m.gpu,
                              m.table)  # fmt: skip
    if c is None and not w.simulated:  # nothing measured: the forward's, said in `where`
        c, fwd_where = kernel_ceiling("full", "fwd", ring, tokens, heads, kv_heads, head_dim,
                                      m.gpu, m.table)  # fmt: skip
        where = f"{where}; the non-causal forward's ({fwd_where}) in its place"
    return c, where


def split_prediction(
    m: Machine, w: Workload, method: str, heads: int, head_dim: int, tokens: int, ulysses: int,
    ring: int, batch: int = 1, dtype: str = "bfloat16", kv_heads: int | None = None,
) -> tuple[Prediction, float | None]:  # fmt: skip
    """(prediction of one call, the ring's kernel ceiling or None) for a split under `w`."""
    kv_heads = kv_heads or heads
    h_r, kv_r = heads // ulysses * batch, kv_heads // ulysses * batch
    if w.simulated:
        p = predict(m, method, heads, head_dim, tokens, ulysses, ring, batch=batch, dtype=dtype,
                    kv_heads=kv_heads)  # fmt: skip
        c = ring_ceiling(m, w, ring, tokens, h_r, kv_r, head_dim)[0] if ring > 1 else None
        return p, c
    # training and causal calls run eagerly (no CUDA graph): the eager forward is the base
    base = "token_ring_eager" if ring > 1 else "ulysses"
    fwd = predict(m, base, heads, head_dim, tokens, ulysses, ring, batch=batch, dtype=dtype,
                  kv_heads=kv_heads)  # fmt: skip
    a2a = fwd.parts.get("all_to_all", 0.0)
    alltoall = a2a * (2 if w.train else 1)
    ceiling = None
    if ring == 1:
        kernels = (fwd.gpu_ms - a2a) * w.kernel_factor
    else:
        ceiling, _ = ring_ceiling(m, w, ring, tokens, h_r, kv_r, head_dim)
        fwd_ceiling = ring_ceiling(m, FORWARD, ring, tokens, h_r, kv_r, head_dim)[0]
        whole_fwd = m.table.block_ms(tokens, tokens, h_r, head_dim)
        # what the simulated forward spends beyond its kernels at their ceiling (transfers not
        # hidden, merges); the backward's lanes carry about as much again
        overhead = max(0.0, fwd.gpu_ms - a2a - whole_fwd / ring / fwd_ceiling)
        kernels = whole_fwd * w.kernel_factor / ring / ceiling
        kernels += overhead * (2 if w.train else 1)
    gpu = kernels + alltoall
    host = fwd.host_ms * (2 if w.train else 1)
    parts = {"kernels": kernels, "all_to_all": alltoall}
    return Prediction(fwd.method if ring > 1 else "ulysses", ulysses, ring, max(gpu, host), gpu,
                      host, parts), ceiling  # fmt: skip


def why(best, others, w: Workload, tokens: int, gpus: int) -> str:
    """One sentence: why `best` (a plan.Choice) wins over the choices of the other kind (ring
    splits vs plain ulysses), naming each ring whose kernel ceiling is below ulysses."""
    p = best.prediction
    rivals = [c for c in others if (c.prediction.ring > 1) != (p.ring > 1)]
    if not rivals:
        return f"only {'ring' if p.ring > 1 else 'ulysses'} splits fit these heads"
    eff = f"predicted efficiency {best.efficiency:.3f}"
    if p.ring > 1:
        ceil = f", ring kernel ceiling {best.ceiling:.3f}" if best.ceiling is not None else ""
        return f"{eff}{ceil} vs {rivals[0].efficiency:.3f} for {rivals[0].label}"
    bounded = {}
    for c in rivals:  # best first: one line per ring degree
        r = c.prediction.ring
        if c.ceiling is not None and c.ceiling < best.efficiency:
            bounded.setdefault(r, c)
    text = eff
    if bounded:
        rings = ", ".join(
            f"ring {r} {c.ceiling:.3f} at {tokens // r} tokens per ring rank"
            for r, c in sorted(bounded.items())
        )
        text += (
            f"; kernel ceiling ({w.label}) below it: {rings}, so no ring schedule reaches "
            "ulysses there with these kernels"
        )
    top = rivals[0]
    ceil = f", ceiling {top.ceiling:.3f}" if top.ceiling is not None else ""
    return text + f"; best ring split {top.label} predicted {top.efficiency:.3f}{ceil}"
