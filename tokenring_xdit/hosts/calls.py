"""How many TokenRing forwards each host adapter ran in this process.

A public proof that TokenRing, not the host's own ring, ran: `tokenring_xdit.calls_by_host()`
returns e.g. {"diffusers": 112} after a pipeline call. The counts are per process (per rank),
kept by the ring where each call runs (ring/seam/compiled_op.py `HOST_CALLS`, by the `host`
label the adapters pass), so nothing registers a counter.
"""

from __future__ import annotations

from ..ring.seam.compiled_op import HOST_CALLS

__all__ = ["calls_by_host", "reset_calls_by_host"]


def calls_by_host() -> dict[str, int]:
    """{host: TokenRing forwards run in this process}; hosts that never ran one are absent."""
    return dict(HOST_CALLS)


def reset_calls_by_host() -> None:
    HOST_CALLS.clear()
