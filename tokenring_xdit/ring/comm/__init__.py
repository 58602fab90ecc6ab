"""How TokenRing moves data: the lane contract, its transports, and a ring's communicators.

- errors.py: TokenRingCommError and the traffic counters;
- groups.py: RingPosition, the communicators a ring needs (made once by its members with the
  passed CommSettings), its deadline, the unusable-after-failure mark;
- teardown.py: the live rings, their teardown, and the ring's own guard on
  destroy_process_group;
- lanes.py: the Lane contract the loops use and the torch.distributed lanes (gloo, NCCL);
- watchdog.py: the NCCL deadline that never blocks the host.
"""

from .errors import COUNTERS, TokenRingCommError, TrafficCounters
from .groups import (
    RingComms,
    RingPosition,
    comms_of,
    describe_peer,
    group_timeout,
    release_ring_comms,
    setup_token_ring_group,
)
from .lanes import Lane, TorchLane, torch_lanes

__all__ = [
    "COUNTERS",
    "Lane",
    "RingComms",
    "RingPosition",
    "TokenRingCommError",
    "TorchLane",
    "TrafficCounters",
    "comms_of",
    "describe_peer",
    "group_timeout",
    "release_ring_comms",
    "setup_token_ring_group",
    "torch_lanes",
]
