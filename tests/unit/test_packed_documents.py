"""Packed documents without a process group: the plan covers every same-document pair once (in
either layout), the per-segment kernel equals the masked one, the load report adds up, claims
rebuild documents."""

from __future__ import annotations

import random

import pytest
import torch

from tokenring_xdit.ring.packed.claims import (
    documents_from_claims,
    documents_from_position_ids,
    local_claims,
)
from tokenring_xdit.ring.packed import Documents, doc_plan, document_work
from tokenring_xdit.ring.segments import Segment
from tokenring_xdit.ring.kernels import MASKED, PAIRS, segment_runs, segments_mask, segments_pair
from tokenring_xdit.ring.tensor_layout import BHSD, BSHD
from tokenring_xdit.ring.schedules import CAUSAL_ZIGZAG, NON_CAUSAL_BLOCKS
from tokenring_xdit.ring.split.sharding import shard_positions, zigzag_positions


def _random_docs(rng: random.Random, total: int) -> Documents:
    count = rng.randint(1, min(30, total))
    return Documents((0, *sorted(rng.sample(range(1, total), count - 1)), total))


@pytest.mark.parametrize("split", ["zigzag", "documents"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("causal", [True, False])
def test_plan_covers_each_document_pair_exactly_once(n, causal, split):
    """In the row's split and in the documents layout (ring/packed/doc_split.py) alike."""
    rng = random.Random(n * 10 + causal)
    for _ in range(20):
        total = 2 * n * rng.randint(1, 6)
        docs = _random_docs(rng, total)
        schedule = CAUSAL_ZIGZAG if causal else NON_CAUSAL_BLOCKS
        plan = doc_plan(docs, schedule, (total // n,) * n, split)
        cut = {"causal": causal, "cu_seqlens": docs.bounds, "layout": split}
        pos = [shard_positions(total, r, n, **cut) for r in range(n)]
        seen = torch.zeros(total, total, dtype=torch.int64)
        for r in range(n):
            for st in plan.steps[r][:n]:
                q_pos, k_pos = pos[st.q_owner], pos[r]
                half_q, half_k = len(q_pos) // 2, len(k_pos) // 2
                q_tile = {"all": q_pos, "front": q_pos[:half_q], "back": q_pos[half_q:]}
                k_tile = {"all": k_pos, "front": k_pos[:half_k], "back": k_pos[half_k:]}
                qt, kt = q_tile[st.q_part], k_tile[st.kv_part]
                allowed = segments_mask(plan.block(r, st.step), len(qt), len(kt), "cpu")
                seen[qt[:, None], kt[None, :]] += allowed.long()
        doc = torch.tensor([docs.doc_at(i) for i in range(total)])
        want = doc[:, None] == doc[None, :]
        if causal:
            want &= torch.ones(total, total, dtype=torch.bool).tril()
        assert torch.equal(seen, want.long()), (n, docs)


def test_segments_pair_equals_masked_kernel():
    gen = torch.Generator().manual_seed(3)
    segs = (Segment(0, 5, 0, 5, True), Segment(5, 6, 5, 6, True), Segment(9, 14, 2, 12, False))
    for layout in (BSHD, BHSD):
        shape = (2, 14, 3, 8) if layout is BSHD else (2, 3, 14, 8)
        q, do = (torch.randn(shape, generator=gen, dtype=torch.float64) for _ in "qo")
        k, v = (torch.randn(shape, generator=gen, dtype=torch.float64) for _ in "kv")
        got_pair, ref_pair = segments_pair(PAIRS["math"]), MASKED
        results = []
        for pair in (got_pair, ref_pair):
            out, lse = pair.forward(q, k, v, 0.3, layout, segs)
            delta = (layout.to_bhsd(do) * layout.to_bhsd(out)).sum(-1)
            grads = pair.backward(do, q, k, v, None, lse, delta, 0.3, layout, segs)
            results.append((out, lse, *grads))
        for a, b in zip(*results, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        # rows 6..8 meet no key: out 0, lse -inf
        assert torch.isinf(results[1][1][:, :, 6:9]).all()


def test_groups_join_abutting_segments_only():
    segs = (Segment(0, 3, 0, 3, True), Segment(3, 7, 3, 7, True), Segment(9, 12, 9, 12, True))
    assert [len(g) for g in segment_runs(segs)] == [2, 1]
    assert len(segment_runs((Segment(0, 3, 0, 3, True), Segment(3, 5, 3, 5, False)))) == 2


def test_document_work_adds_up():
    cu = [0, 5, 6, 30, 31, 48]
    report = document_work(cu, 4, causal=True)
    lengths = [b - a for a, b in zip(cu, cu[1:], strict=False)]
    assert report["pairs_total"] == sum(x * (x + 1) // 2 for x in lengths)
    assert report["dense_pairs"] == 48 * 49 // 2
    assert report["spread"] >= 1.0
    assert sum(r["kernel_calls"] for r in report["ranks"]) < 16  # some blocks skipped
    # documents that never cross a shard: nothing travels
    alone = document_work([0, 3, 6, 9, 12, 15, 18, 21, 24], 4, causal=True)
    assert all(r["q_transfers"] == 0 and r["kernel_calls"] == 1 for r in alone["ranks"])


def test_claims_rebuild_documents():
    rng = random.Random(1)
    for n in (1, 2, 3):
        for _ in range(20):
            total = 2 * n * rng.randint(1, 5)
            docs = _random_docs(rng, total)
            pos = torch.tensor([i - docs.bounds[docs.doc_at(i)] for i in range(total)])
            assert documents_from_position_ids(pos) == docs
            chunks = 2 if n > 1 else 1
            claims = []
            for r in range(n):
                gpos = zigzag_positions(total, r, n) if n > 1 else torch.arange(total)
                c = total // (2 * n)
                starts = [r * c, (2 * n - 1 - r) * c] if n > 1 else [0]
                claims.append(local_claims(pos[gpos], starts, len(gpos)))
            assert documents_from_claims(claims, chunks, total) == docs
