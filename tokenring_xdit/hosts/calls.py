"""How many TokenRing forwards each host adapter ran in this process.

A public proof that TokenRing, not the host's own ring, ran: `tokenring_xdit.calls_by_host()`
returns e.g. {"diffusers": 112} after a pipeline call. The counts are per process (per rank).
"""

from __future__ import annotations

from collections import Counter

__all__ = ["calls_by_host", "reset_calls_by_host", "count_call"]

_CALLS: Counter[str] = Counter()


def count_call(host: str) -> None:
    """Record one TokenRing forward run on behalf of `host` (called by the host adapters)."""
    _CALLS[host] += 1


def calls_by_host() -> dict[str, int]:
    """{host: TokenRing forwards run in this process}; hosts that never ran one are absent."""
    return dict(_CALLS)


def reset_calls_by_host() -> None:
    _CALLS.clear()
