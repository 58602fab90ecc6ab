"""One agreed ring per call: the input check every rank runs before any transfer.

Every fact that decides what a call does is packed into one fixed-size header per rank
(header.py: shapes, dtype, layout, causal/gradient mode and the proof of a causal call's zigzag
layout, the kernel family, final pieces, CUDA graphs on/off, validate mode, transport, the
scale's exact bits, packed documents) and exchanged in one small all-gather on the ring's own
CPU communicator (exchange.py). Every rank then raises the same error (problems.py's `Problem`)
or gets the same `Ring` (call.py). Hosts agree on their ring choice through the same header
(choice.py), so ranks that picked different rings fail together instead of meeting in two
different protocols.

Packed documents are agreed here too: `cu_seqlens` travel as a digest in the header (every rank
must pass the same ones); position ids that restart are turned into per-rank claims
(documents.py) that a second all-gather on the same communicator brings to every rank.
"""

from .agreement import agree
from .choice import Choice, ChoiceSource, agree_ring_choice
from .header import digest
from .problems import CallSpec, Problem, needs_grad

__all__ = [
    "CallSpec", "Choice", "ChoiceSource", "Problem", "agree", "agree_ring_choice", "digest",
    "needs_grad",
]  # fmt: skip
