"""TokenRing schedules: who sends what to whom at each step, as pure tables.

Each schedule module has a Note diagram and a schedule object. The inference forward loop
(`ring/inference/loop.py`) takes `token_ring.NON_CAUSAL` (`steps`, `final_return`, and `held_back`,
the rule for the own block it runs last); the training loop (`ring/training/block_loop.py`, forward and
backward) takes a block schedule (`blocks.BlockSchedule`): `NON_CAUSAL_BLOCKS`, `CAUSAL_ZIGZAG`,
or `CAUSAL_CONTIGUOUS` for a causal packed row cut in contiguous shards.
Pure Python, no torch: the planner (planner/schedules.py) simulates these same tables.
"""

from .blocks import NON_CAUSAL_BLOCKS, BlockSchedule, BlockStep
from .contiguous import CAUSAL_CONTIGUOUS
from .token_ring import NON_CAUSAL, Step, chunk_bounds, held_back
from .zigzag import CAUSAL_ZIGZAG

__all__ = [
    "NON_CAUSAL",
    "NON_CAUSAL_BLOCKS",
    "CAUSAL_ZIGZAG",
    "CAUSAL_CONTIGUOUS",
    "BlockSchedule",
    "BlockStep",
    "Step",
    "chunk_bounds",
    "held_back",
    "block_schedule",
]


def block_schedule(causal: bool, split: str = CAUSAL_ZIGZAG.name) -> BlockSchedule:
    """The block schedule of a training (or packed) call: non-causal blocks, or for a causal
    call the zigzag, or the contiguous table where a packed row is cut in contiguous shards
    (`split`: ring/packed's layout name)."""
    if not causal:
        return NON_CAUSAL_BLOCKS
    return CAUSAL_CONTIGUOUS if split == CAUSAL_CONTIGUOUS.name else CAUSAL_ZIGZAG
