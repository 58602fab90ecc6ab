"""TokenRing schedules: who sends what to whom at each step, as pure tables.

Each schedule module has a Note diagram and a schedule object. The inference forward loop
(`ring/forward.py`) takes `token_ring.NON_CAUSAL` (`steps`, `final_return`); the training loops
(`ring/block_forward.py`, `ring/backward.py`) take a block schedule (`block_steps`):
`blocks.NON_CAUSAL_BLOCKS` or `zigzag.CAUSAL_ZIGZAG`.
"""

from .blocks import NON_CAUSAL_BLOCKS, BlockStep
from .token_ring import NON_CAUSAL, Step, chunk_bounds
from .zigzag import CAUSAL_ZIGZAG

__all__ = ["NON_CAUSAL", "NON_CAUSAL_BLOCKS", "CAUSAL_ZIGZAG", "BlockStep", "Step", "chunk_bounds"]
