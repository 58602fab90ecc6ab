"""TokenRing, host-agnostic: schedules, lanes, merge, kernels, the forward loop and its API.

Nothing here imports from hosts/, patches/ or tools/ (a test checks it).
"""

from .api import token_ring_attn, token_ring_attn_func, token_ring_attn_qkvpacked_func
from .comm import COUNTERS, setup_token_ring_group
from .sharding import shard, unshard

__all__ = [
    "token_ring_attn",
    "token_ring_attn_func",
    "token_ring_attn_qkvpacked_func",
    "setup_token_ring_group",
    "shard",
    "unshard",
    "COUNTERS",
]
