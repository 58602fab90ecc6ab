"""TokenRing, host-agnostic: schedule, lanes, merge, kernels and the forward loop."""

from .attention import token_ring_attn
from .comm import COUNTERS, setup_token_ring_group

__all__ = ["token_ring_attn", "setup_token_ring_group", "COUNTERS"]
