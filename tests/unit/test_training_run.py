"""Training calls as CUDA graphs (RingConfig.train_cuda_graph, ring/training/run.py) without a GPU:
the switch's parsing and which calls it reaches (the per-call override, inference untouched),
and the graph keys of a call's two halves: hashable, equal for equal calls (records rebuilt per
call included), different wherever a captured graph would differ (a packed call's agreed
documents and their layout included)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tokenring_xdit.config import CALL, ENV, RingConfig, scope_of
from tokenring_xdit.ring.agreed_ring import Ring
from tokenring_xdit.ring.comm import RingPosition
from tokenring_xdit.ring.kernels import PAIRS
from tokenring_xdit.ring.kernels.wrappers import expanded
from tokenring_xdit.ring.packed import Documents, doc_plan
from tokenring_xdit.ring.packed.doc_split import DOCUMENTS, ROW
from tokenring_xdit.ring.schedules import CAUSAL_ZIGZAG, NON_CAUSAL_BLOCKS
from tokenring_xdit.ring.seam.prepare import _graphs
from tokenring_xdit.ring.tensor_layout import BHSD, BSHD
from tokenring_xdit.ring.training.block_loop import BlockCall
from tokenring_xdit.ring.training.run import BACKWARD, FORWARD, train_graph_key

VAR = "TOKENRING_XDIT_TRAIN_CUDA_GRAPH"


def test_the_switch_is_auto_by_default_and_parses_as_a_flag_or_auto():
    assert RingConfig().train_cuda_graph is None
    assert RingConfig.from_env({}).train_cuda_graph is None
    assert RingConfig.from_env({VAR: "auto"}).train_cuda_graph is None
    for text in ("1", "true", "yes", "on"):
        assert RingConfig.from_env({VAR: text}).train_cuda_graph is True, text
    for text in ("0", "false", "no", "off"):
        assert RingConfig.from_env({VAR: text}).train_cuda_graph is False, text
    with pytest.raises(ValueError, match=VAR):
        RingConfig.from_env({VAR: "sometimes"})
    assert ENV["train_cuda_graph"][0] == VAR
    assert scope_of("train_cuda_graph") == CALL


@pytest.mark.parametrize("asked", [None, True, False])
@pytest.mark.parametrize("train_flag", [None, False, True])
@pytest.mark.parametrize("infer_flag", [False, True])
def test_training_calls_follow_their_switch_and_inference_keeps_its_own(
    asked, train_flag, infer_flag
):
    cfg = RingConfig(train_cuda_graph=train_flag, cuda_graphs=infer_flag)
    want_train = train_flag if asked is None else asked  # None: auto, after the agreement
    assert _graphs(asked, cfg, True, None) is want_train
    want_infer = infer_flag if asked is None else asked
    assert _graphs(asked, cfg, False, "cudnn") is want_infer
    assert _graphs(asked, cfg, False, None) is False  # an unnamed callable kernel: never


def test_auto_graphs_run_where_every_rank_holds_few_queries_on_cuda_only():
    from tokenring_xdit.config import AUTO_GRAPH_TOKENS
    from tokenring_xdit.ring.seam.prepare import _auto_graphs

    on_cpu = torch.empty(1, 8, 4, 16)
    on_cuda = type("Q", (), {"device": torch.device("cuda")})()  # only its device is read
    few, many = (AUTO_GRAPH_TOKENS,) * 2, (AUTO_GRAPH_TOKENS, AUTO_GRAPH_TOKENS + 2)
    assert _auto_graphs(_ring(q_lens=few), on_cuda)
    assert not _auto_graphs(_ring(q_lens=many), on_cuda)  # one rank over: every rank eager
    assert not _auto_graphs(_ring(q_lens=(8,)), on_cuda)  # a ring of one: one kernel
    assert not _auto_graphs(_ring(q_lens=few), on_cpu)  # graphs are CUDA's


def test_auto_graphs_are_off_under_the_register_hazard_without_a_warning(recwarn):
    hazard = RingConfig(train_cuda_graph=None, graph_register_hazard=True)
    assert _graphs(None, hazard, True, None) is False
    assert not [w for w in recwarn.list if "CUDA graphs" in str(w.message)]


def _ring(q_lens=(8, 8), settings=(1, 2, 3), swapped=False) -> Ring:
    return Ring(pos=RingPosition(None, 0, len(q_lens)), comms=None, q_lens=q_lens,
                settings=settings, swapped=swapped)  # fmt: skip


def _call(**changes) -> BlockCall:
    base = dict(schedule=CAUSAL_ZIGZAG, pair=PAIRS["cpu_flash"], layout=BSHD, scale=0.125)
    return BlockCall(**{**base, **changes})


def _qkv(s=8, h=4, h_kv=2, d=16, dtype=torch.float32):
    return tuple(torch.zeros(1, s, n, d, dtype=dtype) for n in (h, h_kv, h_kv))


def test_a_key_is_hashable_and_equal_for_equal_calls():
    key = train_graph_key(_ring(), _call(), FORWARD, _qkv())
    hash(key)
    # every call prepares its BlockCall anew; a GQA record wrapped anew is equal too
    again = train_graph_key(_ring(), _call(), FORWARD, _qkv())
    assert key == again and hash(key) == hash(again)
    wrapped = [_call(pair=expanded(PAIRS["cpu_flash"])) for _ in range(2)]
    keys = [train_graph_key(_ring(), c, FORWARD, _qkv()) for c in wrapped]
    assert keys[0] == keys[1] and hash(keys[0]) == hash(keys[1])
    assert keys[0] != key  # expanded K/V is another graph


def test_keys_differ_wherever_a_captured_graph_would():
    ring, call, qkv = _ring(), _call(), _qkv()
    key = train_graph_key(ring, call, FORWARD, qkv)
    q, k, v = qkv
    others = {
        "half": train_graph_key(ring, call, BACKWARD, qkv),
        "q length": train_graph_key(ring, call, FORWARD, (torch.zeros(1, 10, 4, 16), k, v)),
        "heads": train_graph_key(ring, call, FORWARD, _qkv(h=2)),
        "dtype": train_graph_key(ring, call, FORWARD, _qkv(dtype=torch.bfloat16)),
        "strides": train_graph_key(
            ring, call, FORWARD, (q.transpose(1, 2).contiguous().transpose(1, 2), k, v)
        ),
        "schedule": train_graph_key(ring, _call(schedule=NON_CAUSAL_BLOCKS), FORWARD, qkv),
        "pair": train_graph_key(ring, _call(pair=PAIRS["math"]), FORWARD, qkv),
        "layout": train_graph_key(ring, _call(layout=BHSD), FORWARD, qkv),
        "scale": train_graph_key(ring, _call(scale=0.25), FORWARD, qkv),
        "head start": train_graph_key(ring, _call(head_start_us=10.0), FORWARD, qkv),
        "hold back": train_graph_key(ring, _call(hold_back=True), FORWARD, qkv),
        "sums": train_graph_key(ring, _call(acc=torch.float64), FORWARD, qkv),
        "ring lengths": train_graph_key(_ring(q_lens=(8, 10)), call, FORWARD, qkv),
        "ring size": train_graph_key(_ring(q_lens=(8, 8, 8)), call, FORWARD, qkv),
        "ring settings": train_graph_key(_ring(settings=(1, 2, 4)), call, FORWARD, qkv),
        "wire": train_graph_key(_ring(swapped=True), call, FORWARD, qkv),
    }
    assert all(other != key for other in others.values()), [
        name for name, other in others.items() if other == key
    ]
    assert len(set(others.values())) == len(others)


def test_a_deterministic_pair_is_another_graph():
    record = PAIRS["cpu_flash"]
    twin = dataclasses.replace(record, deterministic=not record.deterministic)
    ring, qkv = _ring(), _qkv()
    assert train_graph_key(ring, _call(pair=twin), FORWARD, qkv) != train_graph_key(
        ring, _call(pair=record), FORWARD, qkv
    )


def _packed(bounds=(0, 5, 16), split=ROW, schedule=CAUSAL_ZIGZAG) -> BlockCall:
    # Documents made anew (as the agreed ones of every call are): equal by value
    return _call(
        schedule=schedule, plan=doc_plan(Documents(tuple(bounds)), schedule, (8, 8), split)
    )


def test_packed_keys_hold_the_agreed_documents_and_their_layout():
    """Packed calls are graphed: equal keys for equal documents (plans built anew), another key
    for another packing, another layout of the same documents, and the dense call."""
    ring, qkv = _ring(), _qkv()
    key = train_graph_key(ring, _packed(), FORWARD, qkv)
    assert key is not None and train_graph_key(ring, _packed(), BACKWARD, qkv) is not None
    hash(key)
    again = train_graph_key(ring, _packed(), FORWARD, qkv)
    assert key == again and hash(key) == hash(again)
    assert _packed().packing == (ROW, Documents((0, 5, 16)))
    others = {
        "packing": train_graph_key(ring, _packed((0, 7, 16)), FORWARD, qkv),
        "more documents": train_graph_key(ring, _packed((0, 5, 9, 16)), FORWARD, qkv),
        "layout": train_graph_key(ring, _packed(split=DOCUMENTS), FORWARD, qkv),
        "dense": train_graph_key(ring, _call(), FORWARD, qkv),
        "half": train_graph_key(ring, _packed(), BACKWARD, qkv),
    }
    assert all(other != key for other in others.values()), [
        name for name, other in others.items() if other == key
    ]
    assert len(set(others.values())) == len(others)
    assert _call().packing is None


def test_the_autocast_state_is_part_of_the_key():
    """A replay repeats the casts of its capture: a call under autocast is another graph."""
    ring, call, qkv = _ring(), _call(), _qkv()
    plain = train_graph_key(ring, call, FORWARD, qkv)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = train_graph_key(ring, call, FORWARD, qkv)
    assert cast != plain and plain == train_graph_key(ring, call, FORWARD, qkv)
