"""The named error of a failed ring transfer or check, and the traffic counters tests assert."""

from __future__ import annotations

from dataclasses import dataclass, field


class TokenRingCommError(RuntimeError):
    """A TokenRing transfer or check failed or timed out (a peer died, raised, or hangs)."""


LIKELY_CAUSES = (
    "likely causes: that rank raised or exited before this call (see its log), ranks called "
    "TokenRing with different inputs or a different number of times, ranks passed different "
    "groups, or it is slower than the ring's deadline ({timeout:.0f} s)"
)


@dataclass
class TrafficCounters:
    """P2P messages and bytes posted by this process (tests assert the schedule with these)."""

    q_messages: int = 0
    partial_messages: int = 0
    bytes_sent: int = 0
    kernel_calls: int = 0
    handshakes: int = 0
    by_peer: dict[int, int] = field(default_factory=dict)

    def reset(self) -> None:
        self.__init__()


COUNTERS = TrafficCounters()
