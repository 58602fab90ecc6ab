"""What travels round the ring in one training call: queries (TokenRing) or K/V halves both ways.

Per ring step and link direction TokenRing moves L·H·d (Q forward, partials home) and the K/V
family L·Hkv·d (half of K and V each way round; ring/schedules/kv_both_ways.py has the table):
H/Hkv times less under GQA, the same for MHA. `travel="auto"` moves K/V where they are the fewer
bytes (GQA/MQA) and queries elsewhere (MHA, DiTs), on the agreed shapes, so every rank picks the
same. The planner's step-by-step model of both families (planner/kv_both_ways.py) predicts the
same pick on its whole grid (ring 2-8, 4k-64k tokens per GPU, GQA 32/8 and 64/8, MHA 32; the
two rows it calls the other way are within its 2 % margin: tests/unit/test_seam_travel.py), and
`tokenring-xdit plan` prints its times. CPU rings keep TokenRing by rule (no calibration; what
CPU runs exist to test), as `--ring_impl_type auto` does. What the K/V family does not run yet
(packed documents in the documents layout or contiguous causal shards; a window over K/V of
another length than the queries') keeps TokenRing under "auto" and is refused, on every rank,
when forced. Packed documents in the row's split run when forced (ring/packed/kv_plan.py);
"auto" keeps TokenRing for them, whose plan also trims what travels and whose times the planner
models. A sliding window runs on both (dense, and packed in the row's split): both plans skip
the blocks it hides and the transfers no later block needs, so "auto" picks by the same rule
for windowed calls (packed ones stay TokenRing).
"""

from __future__ import annotations

import logging

from ...caches import Seen
from ..agree.problems import CallSpec
from ..agreed_ring import Ring
from ..packed.doc_split import ROW

__all__ = ["TRAVELS", "resolve_travel", "travel_rule"]

log = logging.getLogger("tokenring_xdit")
TRAVELS = ("auto", "q", "kv")
_LOGGED = Seen(256)  # decisions said once per process (rank 0)


def travel_rule(device_type: str, heads: int, kv_heads: int, ring_size: int) -> tuple[str, str]:
    """`auto`'s pick for a training call the K/V family can run: ("q" or "kv", why)."""
    if ring_size < 2:
        return "q", "no ring"
    if device_type != "cuda":
        return "q", f"{device_type}: no calibration, TokenRing by rule"
    if kv_heads < heads:
        return "kv", f"{heads}/{kv_heads} heads: K/V move {heads // kv_heads}x fewer bytes a step"
    return "q", "MHA: the same bytes a step either way, TokenRing's schedule"


def resolve_travel(asked: str, ring: Ring, spec: CallSpec, windowed: bool) -> str:
    """The travel ("q" or "kv") of a training call on the agreed `ring` (`spec`'s shapes and
    settings are agreed by now; `windowed`: a sliding window, agreed). Raises the same error on
    every rank where "kv" is forced and cannot run."""
    split = ring.plan.split if ring.plan is not None else ROW
    blocker = ""
    if split != ROW:
        blocker = f"does not run packed documents in the {split!r} layout yet"
    elif windowed and ring.kv_lens != ring.q_lens:
        blocker = "runs a sliding window only over K/V of the queries' length on every rank"
    if asked == "kv" and blocker:
        raise NotImplementedError(f"TokenRing: travel='kv' (K/V both ways) {blocker}; use "
                                  "travel='q' or 'auto'")  # fmt: skip
    if asked != "auto" or blocker or ring.plan is not None:  # (auto: packed stays TokenRing)
        return asked if asked != "auto" else "q"
    heads, kv_heads = spec.q.shape[spec.layout.head_dim], spec.k.shape[spec.layout.head_dim]
    pick, why = travel_rule(spec.q.device.type, heads, kv_heads, ring.size)
    if ring.rank == 0 and _LOGGED.first((pick, why)):
        log.info("TokenRing travel=auto: moving %s (%s)", "K/V" if pick == "kv" else "Q", why)
    return pick
