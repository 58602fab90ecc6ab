"""TokenRing schedules: who sends what to whom at each step, as pure tables.

Each schedule module has a Note diagram and a schedule object with `name`,
`steps(rank, world_size) -> tuple[Step, ...]` and `final_return(rank, world_size)`; the forward
loop (`ring/forward.py`) takes one as a parameter.
"""

from .token_ring import NON_CAUSAL, Step, chunk_bounds

__all__ = ["NON_CAUSAL", "Step", "chunk_bounds"]
