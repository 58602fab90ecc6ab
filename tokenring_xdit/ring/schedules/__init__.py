"""TokenRing schedules: who sends what to whom at each step, as pure tables.

Each schedule module has a Note diagram and a schedule object. The inference forward loop
(`ring/forward.py`) takes `token_ring.NON_CAUSAL` (`steps`, `final_return`, and `held_back`,
the rule for the own block it runs last); the training loop (`ring/block_loop.py`, forward and
backward) takes a block schedule (`blocks.BlockSchedule`): `NON_CAUSAL_BLOCKS` or `CAUSAL_ZIGZAG`.
Pure Python, no torch: the planner (planner/schedules.py) simulates these same tables.
"""

from .blocks import NON_CAUSAL_BLOCKS, BlockSchedule, BlockStep
from .token_ring import NON_CAUSAL, Step, chunk_bounds, held_back
from .zigzag import CAUSAL_ZIGZAG

__all__ = [
    "NON_CAUSAL",
    "NON_CAUSAL_BLOCKS",
    "CAUSAL_ZIGZAG",
    "BlockSchedule",
    "BlockStep",
    "Step",
    "chunk_bounds",
    "held_back",
]
