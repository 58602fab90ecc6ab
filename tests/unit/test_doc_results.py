"""The results README.md and docs/performance.md quote are the committed JSON's: each table line is
rebuilt from its evidence file (tests/doc_results.py) and must be on its page as built."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import doc_results as results

ROOT = Path(__file__).resolve().parents[2]
PERFORMANCE = [
    ("ring 2", lambda: results.sweep_table("inference-ring2-ring4-h200-2026-11-26/sweep_r2.json")),
    ("ring 4", lambda: results.sweep_table("inference-ring2-ring4-h200-2026-11-26/sweep_r4.json")),
    ("ulysses 2 x ring 2",
     lambda: results.sweep_table("inference-ring2-ring4-h200-2026-11-26/sweep_u2r2.json")),
    ("host-staged", results.p2p_off_table),
    ("IPC vs NCCL", results.transport_table),
    ("end to end", results.e2e_table),
    ("training", results.train_table),
    ("training graphs", results.train_graph_table),
    ("packed, new packing", results.new_packing_table),
    ("packed, plans built", results.packed_plans_built_table),
    ("packed kernels", results.new_packing_kernels_table),
    ("last return's pieces", results.pieces_table),
]  # fmt: skip


@pytest.mark.parametrize(("name", "build"), PERFORMANCE, ids=[n for n, _ in PERFORMANCE])
def test_every_performance_table_is_its_evidence(name, build):
    page = [line.strip() for line in (ROOT / "docs" / "performance.md").read_text().splitlines()]
    lines = build()
    missing = [line for line in lines if line not in page]
    assert len(lines) > 2 and not missing, f"{name}: not on the page as built: {missing}"


def test_the_readme_results_table_is_its_evidence():
    page = (ROOT / "README.md").read_text().splitlines()
    rows = results.readme_rows()
    assert len(rows) >= 10
    for label, token_ring, other in rows:
        found = [line for line in page if line.startswith(f"| {label} |")]
        assert len(found) == 1, f"README has no single row {label!r}"
        cells = [c.strip() for c in found[0].strip("|").split("|")]
        assert cells[2].startswith(token_ring) and cells[3] == other, (label, cells)
