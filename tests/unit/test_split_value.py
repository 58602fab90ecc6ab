"""The split as a value (ring/split/): one immutable record of how a sequence is cut across the
ring, made by `make_split`, taken by shard / unshard / shard_positions and by the call, agreed as
ONE header field, and carried through a compiled graph as text. No process-wide table."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tokenring_xdit import Split, make_split, shard, shard_positions, unshard
from tokenring_xdit.ring.agree.header import CACHE_KEY, FIELDS, MUST_AGREE, RING_SETTINGS
from tokenring_xdit.ring.agree.problems import Problem
from tokenring_xdit.ring.agree.proof import call_split
from tokenring_xdit.ring.seam.prepare import CallOptions, op_args
from tokenring_xdit.ring.split.value import KINDS, split_words

SPLIT_DIR = Path(__file__).resolve().parents[2] / "tokenring_xdit" / "ring" / "split"


def test_a_split_is_immutable_and_built_by_keyword():
    split = make_split(16, 2, causal=True)
    assert split == Split(kind="zigzag", total=16, world_size=2, proof="cut")
    with pytest.raises(dataclasses.FrozenInstanceError):
        split.total = 8  # type: ignore[misc]
    with pytest.raises(TypeError):
        Split("zigzag", 16, 2)  # type: ignore[misc]
    assert hash(split) == hash(make_split(16, 2, causal=True))


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"kind": "rows", "total": 8, "world_size": 2, "proof": "cut"}, "kind must be one of"),
        ({"kind": "zigzag", "total": 8, "world_size": 2}, "needs a proof"),
        ({"kind": "zigzag", "total": 10, "world_size": 2, "proof": "cut"}, "multiple of 4"),
        ({"kind": "documents", "total": 6, "world_size": 2, "proof": "cut"}, "multiple of 4"),
        ({"kind": "contiguous", "total": 7, "world_size": 2, "proof": "cut"}, "multiple of 2"),
        ({"kind": "plain", "total": 8}, "a plain split has no length"),
    ],
)
def test_a_split_no_cut_can_have_is_refused(fields, why):
    with pytest.raises(ValueError, match=why):
        Split(**fields)


def test_make_split_names_the_cut_it_makes():
    cu = [0, 5, 16]
    assert make_split(16, 2, causal=True).kind == "zigzag"
    assert make_split(16, 2, causal=False).kind == "contiguous"
    assert make_split(16, 1, causal=True).kind == "contiguous"  # one shard: the whole row
    assert make_split(16, 2, causal=False, layout="zigzag").kind == "contiguous"
    documents = make_split(16, 2, causal=True, cu_seqlens=cu, layout="documents")
    assert documents.kind == "documents" and documents.docs.bounds == (0, 5, 16)
    contiguous = make_split(16, 2, causal=True, cu_seqlens=cu, layout="contiguous")
    assert contiguous.kind == "contiguous" and contiguous.proof == "cut"
    with pytest.raises(ValueError, match="pad the sequence to 16 tokens"):
        make_split(14, 2, causal=True)
    with pytest.raises(ValueError, match="pass cu_seqlens="):
        make_split(16, 2, causal=True, layout="documents")
    with pytest.raises(ValueError, match="multiple of 3"):
        make_split(16, 3, causal=True, layout="contiguous")
    with pytest.raises(ValueError, match="cu_seqlens ends at 16"):
        make_split(20, 2, causal=True, cu_seqlens=cu)


def test_a_dense_row_cuts_contiguous_without_cu_seqlens():
    """Causal contiguous shards of a dense row: the split holds it as one document, the same
    split as cu_seqlens=[0, S] gives; a non-causal or one-rank row stays the row's own cut."""
    dense = make_split(24, 3, causal=True, layout="contiguous")
    assert dense == make_split(24, 3, causal=True, cu_seqlens=[0, 24], layout="contiguous")
    assert dense.kind == "contiguous" and dense.docs.bounds == (0, 24)
    for n, causal in ((3, False), (1, True)):
        plain = make_split(24, n, causal=causal, layout="contiguous")
        assert plain.kind == "contiguous" and plain.docs is None, (n, causal)


def test_the_header_field_and_the_words():
    split = make_split(16, 2, causal=True)
    assert split.code == KINDS.index("zigzag") + len(KINDS) * 16
    assert split_words(split.code) == "the zigzag split of 16 tokens"
    assert split_words(Split().code) == "no split" and Split().code == 0
    assert split.words == "the zigzag split of 16 tokens over 2 ranks, cut by tokenring_xdit.shard"


def test_the_split_is_one_header_field_and_ring_settings_go_by_name():
    assert "split" in FIELDS and not {"proof", "total"} & set(FIELDS)
    assert "split" in MUST_AGREE and "split" in CACHE_KEY and "split" in RING_SETTINGS
    assert set(RING_SETTINGS) <= set(FIELDS)
    assert not {"q_len", "kv_len", "gpu", "docs", "ndocs", "wire"} & set(RING_SETTINGS)


def test_the_split_travels_a_compiled_graph_as_a_tensor():
    """Its documents stay out of it: the operator gets them as the cu_seqlens tensor."""
    split = make_split(16, 2, causal=True, cu_seqlens=[0, 5, 16], layout="documents")
    encode = dict(op_args())["split"]
    encoded = encode.encode(split)
    assert isinstance(encoded, torch.Tensor) and encoded.numel() == 4
    back = encode.decode(encoded)
    assert back == dataclasses.replace(split, docs=None) and back.docs is None
    assert encode.encode(None) is None and encode.decode(None) is None


def test_positions_round_trip_for_every_kind():
    """Every rank's positions together are the row, once; shard is x[..., positions]; unshard
    of one rank is the identity (a ring of one)."""
    cu = [0, 1, 6, 7, 24]
    x = torch.arange(24.0).reshape(1, 24)
    for causal in (True, False):
        for layout in ("zigzag", "documents", "contiguous", "auto"):
            for n in (1, 2, 3, 4):
                split = make_split(24, n, causal=causal, cu_seqlens=cu, layout=layout)
                pos = torch.cat([shard_positions(split, r) for r in range(n)])
                assert sorted(pos.tolist()) == list(range(24)), (causal, layout, n)
                old = shard_positions(24, 0, n, causal=causal, cu_seqlens=cu, layout=layout)
                assert torch.equal(old, shard_positions(split, 0))
    one = make_split(24, 1, causal=True)
    assert torch.equal(unshard(shard(x, split=one, dim=1), split=one, dim=1), x)
    with pytest.raises(ValueError, match="this group has 1 ranks"):
        shard(x, split=make_split(24, 2, causal=True), dim=1)
    with pytest.raises(TypeError, match="pass split= alone"):
        shard(x, split=one, causal=True, dim=1)


def _options(**given) -> SimpleNamespace:
    base = dict(split=None, positions=None, cu_seqlens=None, position_ids=None, causal=True)
    return SimpleNamespace(**{**base, **given})


def test_how_a_rank_knows_its_split():
    """No split: nothing for a non-causal call, no proof for a causal one over a ring;
    positions prove the zigzag split (and are checked against a given split)."""
    zig = make_split(16, 2, causal=True)
    pos1 = shard_positions(zig, 1)
    assert call_split(_options(causal=False), 0, 2, 8)[1] == Problem.NONE
    assert call_split(_options(), 0, 2, 8)[1] == Problem.NO_PROOF
    assert call_split(_options(), 0, 1, 8)[1] == Problem.NONE  # a ring of one
    proved, problem, _ = call_split(_options(positions=pos1), 1, 2, 8)
    assert problem == Problem.NONE and proved.kind == "zigzag" and proved.proof == "positions"
    assert call_split(_options(positions=pos1), 0, 2, 8)[1] == Problem.BAD_POSITIONS
    assert call_split(_options(split=zig), 1, 2, 8) == (zig, Problem.NONE, "")
    assert call_split(_options(split=zig, positions=pos1), 0, 2, 8)[1] == Problem.BAD_POSITIONS
    assert call_split(_options(), 0, 2, 7)[1] == Problem.NOT_ZIGZAG


def test_what_does_not_fit_a_call_is_named():
    cu = [0, 5, 16]
    docs = make_split(16, 2, causal=True, cu_seqlens=cu, layout="documents")
    bare = dataclasses.replace(docs, docs=None)
    cases = {
        "this ring has 3 ranks": (_options(split=docs), 3),
        "cu_seqlens differ": (_options(split=docs, cu_seqlens=[0, 4, 16]), 2),
        "cannot place the pieces": (_options(split=bare, position_ids=torch.arange(8)), 2),
        "needs the row's documents": (
            _options(split=Split(kind="contiguous", total=16, world_size=2, proof="cut")),
            2,
        ),
        "need causal=True": (
            _options(causal=False, split=make_split(16, 2, causal=True), cu_seqlens=cu),
            2,
        ),
    }
    for words, (options, size) in cases.items():
        _, problem, text = call_split(options, 0, size, 16 // size)
        assert problem == Problem.SPLIT and words in text, (words, text)
    merged, problem, _ = call_split(_options(split=bare, cu_seqlens=torch.tensor(cu)), 0, 2, 8)
    assert problem == Problem.NONE and merged == docs  # documents beside the split join it


def test_a_call_takes_the_split_as_one_option():
    assert "split" in {f.name for f in dataclasses.fields(CallOptions)}
    assert "doc_layout" not in {f.name for f in dataclasses.fields(CallOptions)}


def test_no_process_wide_table_decides_a_later_call():
    """The split modules keep no module-level mutable container (the old declared tables)."""
    mutable = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
    for path in SPLIT_DIR.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if getattr(getattr(node, "targets", [None])[0], "id", "") == "__all__":
                continue
            value = getattr(node, "value", None)
            called = isinstance(value, ast.Call) and getattr(value.func, "id", getattr(
                value.func, "attr", "")) in {"dict", "list", "set", "OrderedDict",
                                             "WeakKeyDictionary", "defaultdict"}  # fmt: skip
            assert not (isinstance(value, mutable) or called), f"{path.name}: {ast.dump(node)}"
