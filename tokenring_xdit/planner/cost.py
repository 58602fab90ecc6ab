"""Predicted time of one attention call for a ulysses x ring split and a ring implementation.

USP (yunchang/xDiT) runs, on N = U x R ranks that each hold S/N tokens of all heads:
  all-to-all of q, k, v over the U ranks of a ulysses group (heads -> sequence): h/U heads, S/R
  tokens; the ring over the R ranks of stride U; the all-to-all of the output back. With R = 1
  it is plain ulysses (one local kernel on the whole sequence).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import schedules
from .machine import Machine
from .schedules import DEFAULTS, Block, RingOptions, SimResult

__all__ = ["RINGS", "METHODS", "Prediction", "predict", "ring_ranks", "ulysses_ranks"]

# ring implementations the planner ranks, and what each is in the host libraries
RINGS = {
    "token_ring": "TokenRing (this package; CUDA graph per call)",
    "torch_ag": "all-gather K/V ring (xDiT 0.7 USP default, diffusers ContextParallelConfig)",
    "yunchang_p2p": "yunchang P2P K/V ring (ring_impl_type='basic', torch flash kernel)",
}
METHODS = (*RINGS, "token_ring_eager", "ulysses")


@dataclass
class Prediction:
    method: str
    ulysses: int
    ring: int
    ms: float
    gpu_ms: float
    host_ms: float
    parts: dict[str, float] = field(default_factory=dict)


def ulysses_ranks(m: Machine, ulysses: int) -> list[int]:
    return list(range(ulysses))  # group 0; the others are the same up to a shift


def ring_ranks(m: Machine, ulysses: int, ring: int) -> list[int]:
    return [i * ulysses for i in range(ring)]


def _alltoall_ms(m: Machine, ranks: list[int], nbytes: float) -> float:
    """One all-to-all of a `nbytes` tensor per rank over `ranks` (each keeps 1/U of it)."""
    u = len(ranks)
    if u == 1:
        return 0.0
    src = ranks[0]
    per_peer = nbytes / u
    flows: dict[str, list[float]] = {}
    for dst in ranks[1:]:
        flows.setdefault(m.link(src, dst).name, []).append(per_peer)
    out = 0.0
    for name, sizes in flows.items():
        f = m.intra if name == m.intra.name else m.inter
        # to one peer it is the exchange pattern; to several, the multi-peer pattern
        pattern = "ring" if len(sizes) == 1 and u == 2 else "two_peers"
        out = max(out, f.pattern(pattern).ms(sum(sizes)))
    # the layout copies around it (contiguous before, permute after)
    return out + m.mem_ms(4 * nbytes)


def _ring(
    m: Machine,
    method: str,
    block: Block,
    ranks: list[int],
    final_pieces: int = 1,
    options: RingOptions = DEFAULTS,
) -> SimResult:
    if len(ranks) == 1 or method == "ulysses":
        return schedules.single(m, block)
    if method in ("token_ring", "token_ring_eager"):
        graphs = method == "token_ring"
        return schedules.token_ring(m, block, ranks, graphs, final_pieces, options)
    if method == "torch_ag":
        return schedules.allgather_ring(m, block, ranks)
    if method == "yunchang_p2p":
        return schedules.kv_ring(m, block, ranks, kernel="flash")
    raise ValueError(f"unknown method '{method}'; use one of {', '.join(METHODS)}")


def predict(
    m: Machine,
    method: str,
    heads: int,
    head_dim: int,
    tokens: int,
    ulysses: int,
    ring: int,
    batch: int = 1,
    dtype: str = "bfloat16",
    final_pieces: int | None = None,
    kv_heads: int | None = None,
    options: RingOptions = DEFAULTS,
) -> Prediction:
    """Milliseconds of one attention call (every rank; the slowest rank sets the time).

    final_pieces: pieces TokenRing cuts its last block into (default 1, the current code; the
    committed sweeps ran with `schedules.old_final_pieces`). kv_heads: K/V heads under GQA/MQA
    (None: = heads); ulysses splits them too, so it must divide them. options: TokenRing's
    held-back share and head start (default: RingConfig's; sweeps timed before those existed
    ran with RingOptions(defer_own=0, head_start_us=0)).
    """
    kv_heads = kv_heads or heads
    if heads % ulysses or kv_heads % ulysses:
        raise ValueError(
            f"ulysses degree {ulysses} must divide the {heads} heads and {kv_heads} K/V heads"
        )
    if heads % kv_heads:
        raise ValueError(f"{kv_heads} K/V heads must divide the {heads} query heads")
    if ulysses * ring > m.gpus:
        raise ValueError(f"{ulysses} x {ring} needs {ulysses * ring} GPUs, machine has {m.gpus}")
    n = ulysses * ring
    local = tokens / ring  # after the ulysses all-to-all
    # batch runs as more heads: the kernels tile (batch x heads) the same way
    block = Block(
        heads=heads // ulysses * batch,
        head_dim=head_dim,
        q_len=round(local),
        kv_len=round(local),
        dtype_bytes=4 if dtype == "float32" else 2,
        dtype=dtype,
        kv_heads=kv_heads // ulysses * batch,
    )
    method = method if ring > 1 else "ulysses"
    res = _ring(m, method, block, ring_ranks(m, ulysses, ring), final_pieces or 1, options)
    a2a = 0.0
    host = res.host_ms
    if ulysses > 1:
        shard = tokens / n * batch * head_dim * block.dtype_bytes
        q_one = _alltoall_ms(m, ulysses_ranks(m, ulysses), shard * heads)
        kv_one = _alltoall_ms(m, ulysses_ranks(m, ulysses), shard * kv_heads)
        a2a = 2 * q_one + 2 * kv_one  # q, k, v in; out back
        host += m.params.host_us["comm"] * 4 / 1e3 + m.params.host_us["elementwise"] * 8 / 1e3
    gpu = res.gpu_ms + a2a
    parts = {**res.breakdown, "all_to_all": a2a}
    return Prediction(method, ulysses, ring, max(gpu, host), gpu, host, parts)
