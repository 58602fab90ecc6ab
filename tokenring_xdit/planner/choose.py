"""`--ring_impl_type auto`: TokenRing or the host's default ring, from the cost model.

A pure function of its arguments (no clocks, no randomness, no process group): every rank that
passes the same arguments gets the same answer, so the ranks of a ring never disagree.
"""

from __future__ import annotations

from functools import lru_cache

from .machine import make_machine
from .schedules import Block, allgather_ring, token_ring

__all__ = ["choose_ring", "ring_times"]

# TokenRing must win by this much to be picked: the model's errors are ~10 %, and the default
# ring is the one users already run.
MARGIN = 0.02


@lru_cache(maxsize=256)
def ring_times(
    heads: int,
    head_dim: int,
    q_len_local: int,
    kv_len_local: int,
    ring_degree: int,
    dtype: str = "bfloat16",
    device_name: str = "NVIDIA H200",
    fabric: str = "nvswitch",
    graphs: bool = True,
    kv_heads: int | None = None,
) -> tuple[float, float]:
    """Predicted ms of one call: (TokenRing, all-gather K/V ring). Arguments as choose_ring's."""
    m = make_machine(ring_degree, fabric_name=fabric, gpu=device_name)
    block = Block(
        heads=heads,
        head_dim=head_dim,
        q_len=q_len_local,
        kv_len=kv_len_local,
        dtype_bytes=4 if dtype == "float32" else 2,
        dtype=dtype,
        kv_heads=kv_heads,
    )
    ranks = list(range(ring_degree))
    return token_ring(m, block, ranks, graphs=graphs).ms, allgather_ring(m, block, ranks).ms


@lru_cache(maxsize=256)
def choose_ring(
    heads: int,
    head_dim: int,
    q_len_local: int,
    kv_len_local: int,
    ring_degree: int,
    dtype: str = "bfloat16",
    device_name: str = "NVIDIA H200",
    fabric: str = "nvswitch",
    graphs: bool = True,
    kv_heads: int | None = None,
) -> str:
    """ "token_ring" or "default" (all-gather K/V ring) for one ring attention call.

    heads: heads on this rank (after ulysses); q_len_local/kv_len_local: tokens per rank in the
    ring (kv_len_local > q_len_local with a PipeFusion KV cache); graphs: whether TokenRing
    replays its CUDA graph; kv_heads: K/V heads on this rank under GQA (None: = heads), which
    shrink what the K/V ring moves and not what TokenRing moves. Ring degree 1 has no ring:
    "default".
    """
    if ring_degree <= 1:
        return "default"
    shape = (heads, head_dim, q_len_local, kv_len_local, ring_degree)
    tr, ag = ring_times(*shape, dtype, device_name, fabric, graphs, kv_heads)
    return "token_ring" if tr < ag * (1 - MARGIN) else "default"
