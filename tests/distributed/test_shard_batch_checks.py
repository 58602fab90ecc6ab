"""shard_batch refuses position_ids and cu_seqlens that disagree, on every rank, before any cut.

Both given, the model would get the position ids while attention and labels follow cu_seqlens:
a silent mismatch. Agreeing ones (position ids restarting at each cu_seqlens offset) are kept.
"""

from __future__ import annotations

from tests.harness import run_ranks, values


def _packed(torch, lengths):
    pos = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return pos, cu


def _worker(rank, n):
    import torch

    from tokenring_xdit.integrations import transformers as tr_hf

    ids = torch.arange(16).unsqueeze(0)
    pos, cu = _packed(torch, [5, 3, 8])
    from tokenring_xdit.ring.packed import Documents, pick_layout

    agreed = tr_hf.shard_batch(ids, position_ids=pos, cu_seqlens=cu, layout="zigzag")
    per_doc = tr_hf.shard_batch(ids, position_ids=pos, cu_seqlens=cu, layout="documents")
    contig = tr_hf.shard_batch(ids, position_ids=pos, cu_seqlens=cu, layout="contiguous")
    picked = pick_layout(Documents.of(cu.tolist()), n, True)
    cut = {"zigzag": agreed, "documents": per_doc, "contiguous": contig}[picked]
    auto = tr_hf.shard_batch(ids, position_ids=pos, cu_seqlens=cu)
    _, other_cu = _packed(torch, [6, 2, 8])  # offset 5 vs 6
    try:
        tr_hf.shard_batch(ids, position_ids=pos, cu_seqlens=other_cu)
    except ValueError as exc:
        refused = str(exc)
    else:
        refused = "no error"
    same = auto["input_ids"].tolist() == cut["input_ids"].tolist()
    cuts = [x["position_ids"].tolist() for x in (agreed, per_doc, contig)]
    ids_cut = [x["input_ids"].tolist() for x in (per_doc, contig)]
    return cuts, agreed["cu_seq_lens_q"].tolist(), refused, ids_cut, same


def test_disagreeing_position_ids_and_cu_seqlens_are_refused_on_every_rank():
    results = values(run_ranks(_worker, 2, timeout=120))
    for _, cu, refused, _, same in results:
        assert same  # auto cuts as the layout pick_layout names (every rank alike)
        assert cu == [0, 5, 8, 16]
        assert "position_ids and cu_seqlens disagree at token 5" in refused, refused
        assert "pass only one of them" in refused
    # the agreeing pair keeps the given (per-document) positions, zigzag-cut
    assert results[0][0][0] == [[0, 1, 2, 3, 4, 5, 6, 7]]
    assert results[1][0][0] == [[4, 0, 1, 2, 0, 1, 2, 3]]
    # the documents layout (docs/training-internals.md's rule: pieces 2 1 1 1 | 0 1 1 1 | 2 2 2 2);
    # the position ids follow the tokens
    assert results[0][3][0] == [[0, 1, 8, 9, 4, 7, 14, 15]]
    assert results[1][3][0] == [[2, 5, 10, 11, 3, 6, 12, 13]]
    assert results[0][0][1] == [[0, 1, 0, 1, 4, 2, 6, 7]]
    assert results[1][0][1] == [[2, 0, 2, 3, 3, 1, 4, 5]]
    # contiguous shards: tokens 0-7 and 8-15, the position ids with them
    assert results[0][3][1] == [list(range(8))] and results[1][3][1] == [list(range(8, 16))]
    assert results[0][0][2] == [[0, 1, 2, 3, 4, 0, 1, 2]]
    assert results[1][0][2] == [list(range(8))]


def test_global_positions_with_cu_seqlens_are_refused():
    import torch

    from tokenring_xdit.integrations import transformers as tr_hf

    ids = torch.arange(8).unsqueeze(0)
    _, cu = _packed(torch, [3, 5])
    try:
        tr_hf.shard_batch(ids, position_ids=torch.arange(8).unsqueeze(0), cu_seqlens=cu)
    except ValueError as exc:
        assert "disagree at token 3" in str(exc)
    else:
        raise AssertionError("global positions with cu_seqlens were accepted")
