"""Packed documents over the ring: who sends what, the plans, the cost model and the pack order.

The one way in for the rest of the package: the call seam (seam/prepare.py) prices the packed
kernels (`kernel_order`), the agreement (ring/agree/) learns documents from position ids
(claims) and makes the call's plan (`call_plan`), the split helpers (ring/split/) place
pieces and let `auto` pick a layout. Kernels only ever see the plan's segments
(ring/segments.py); the loops see the plan through `agreed_ring.BlockPlan`.

- doc_split.py: the documents layout (every document in 2N pieces) and the layout names;
- documents.py: a block's segments and the call's `DocPlan`;
- claims.py: documents from position ids that restart, through per-rank claims;
- cost.py (+ data/cost_model.json): a rank's predicted time per packed kernel;
- pick.py: `auto`'s (layout, kernel) by predicted time; report.py: `document_work`;
- pack_order.py: an order to pack documents in that balances the ranks.
"""

from ..split.value import Documents
from .claims import claim_count, documents_from_claims, documents_from_position_ids, local_claims
from .cost import KERNELS
from .doc_split import CONTIGUOUS, DOCUMENTS, LAYOUTS, ROW, check_total, local_positions
from .documents import DocPlan, call_plan, doc_plan, layout_of
from .pack_order import balanced_order
from .pick import kernel_order, pick_layout
from .report import document_work

__all__ = [
    "Documents", "DocPlan", "KERNELS", "ROW", "DOCUMENTS", "CONTIGUOUS", "LAYOUTS",
    "balanced_order", "call_plan", "check_total", "claim_count", "doc_plan",
    "document_work", "documents_from_claims", "documents_from_position_ids", "kernel_order",
    "layout_of", "local_claims", "local_positions", "pick_layout",
]  # fmt: skip
