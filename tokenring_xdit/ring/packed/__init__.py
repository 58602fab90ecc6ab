"""Packed documents over the ring: who sends what, the plans, the cost model and the pack order.

The one way in: the call seam prices the packed kernels (`kernel_order`), the agreement learns
documents from position ids (claims) and makes the call's plan (`call_plan`), ring/split/ (the
`Split`, over these `Documents`) places pieces and picks layouts. Kernels see only segments
(ring/segments.py), the loops the plan (`agreed_ring.BlockPlan`). doc_split.py: the documents
layout; documents.py: segments and the `DocPlan`; kv_plan.py: the K/V family's per-block segments
(`KvPlan`); claims.py; cost.py (+ data/): predicted time per kernel; pick.py: `auto`'s choice;
report.py: `document_work`; pack_order.py: a packing order that balances the ranks.
"""

from ..kernels.names import PRICED
from .claims import claim_count, documents_from_claims, documents_from_position_ids, local_claims
from .doc_split import (
    CONTIGUOUS,
    DOCUMENTS,
    LAYOUTS,
    ROW,
    check_total,
    local_positions,
    normal_split,
)
from .documents import DocPlan, Documents, call_plan, doc_plan
from .pack_order import balanced_order
from .pick import kernel_order, pick_layout
from .report import document_work

__all__ = [
    "Documents", "DocPlan", "PRICED", "ROW", "DOCUMENTS", "CONTIGUOUS", "LAYOUTS",
    "balanced_order", "call_plan", "check_total", "claim_count", "doc_plan",
    "document_work", "documents_from_claims", "documents_from_position_ids", "kernel_order",
    "local_claims", "local_positions", "normal_split", "pick_layout",
]  # fmt: skip
