"""`travel="auto"`: the rule the call seam applies (ring/seam/travel.py) against the planner's
step-by-step model of both ring families (planner/kv_both_ways.py; with a window:
planner/window.py and planner/kv_window.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tokenring_xdit.planner.kv_both_ways import TRAVEL_MARGIN, TrainShape, choose_travel, train_ms
from tokenring_xdit.planner.kv_window import kv_window_train_ms
from tokenring_xdit.planner.machine import make_machine
from tokenring_xdit.planner.window import window_train_ms
from tokenring_xdit.ring.seam.travel import travel_rule


def test_rule_moves_kv_under_gqa_and_queries_for_mha_on_cuda():
    assert travel_rule("cuda", 32, 8, 4)[0] == "kv"
    assert travel_rule("cuda", 8, 1, 2)[0] == "kv"
    assert travel_rule("cuda", 32, 32, 4)[0] == "q"
    assert travel_rule("cpu", 32, 8, 4)[0] == "q"  # no calibration on CPU: TokenRing by rule
    assert travel_rule("cuda", 32, 8, 1)[0] == "q"


@pytest.mark.parametrize("ring", [2, 4, 8])
def test_rule_is_the_planners_pick_or_within_its_margin(ring):
    """Over the planner's grid the rule and the model pick alike, or the model's two times are
    within its margin of each other (a tie either pick serves)."""
    m = make_machine(ring)
    off = []
    for heads, kv_heads in ((32, 8), (64, 8), (32, 32)):
        for tokens in (4096, 8192, 16384, 32768, 65536):
            for causal in (True, False):
                s = TrainShape(heads, kv_heads, 128, tokens, causal)
                model, _ = choose_travel(s, ring)
                if model == travel_rule("cuda", heads, kv_heads, ring)[0]:
                    continue
                tr, kv = (train_ms(m, f, s, list(range(ring)))["ms"] for f in
                          ("token_ring", "kv_both_ways"))  # fmt: skip
                if abs(kv / tr - 1) > TRAVEL_MARGIN:
                    off.append((heads, kv_heads, tokens, causal, round(kv / tr, 3)))
    assert not off, off


@pytest.mark.parametrize("ring", [2, 4, 8])
def test_windowed_rule_is_the_planners_pick_or_within_its_margin(ring):
    """A dense windowed call runs on zigzag shards in either family (a causal contiguous cut is
    packed: TokenRing keeps it), so the model prices both plans on those shards; the rule's pick
    is the faster, or the two are within the margin."""
    m, ranks = make_machine(ring), list(range(ring))
    off = []
    for heads, kv_heads in ((32, 8), (64, 8), (32, 32)):
        for tokens in (4096, 16384):
            for window in (128, 1024, 4096):
                s = TrainShape(heads, kv_heads, 128, tokens, causal=True)
                tr = window_train_ms(m, s, ranks, window, "zigzag")["ms"]
                kv = kv_window_train_ms(m, s, ranks, window)["ms"]
                model = "kv" if kv < tr * (1 - TRAVEL_MARGIN) else "q"
                if model != travel_rule("cuda", heads, kv_heads, ring)[0]:
                    if abs(kv / tr - 1) > TRAVEL_MARGIN:
                        off.append((heads, kv_heads, tokens, window, round(kv / tr, 3)))
    assert not off, off


def _ring(kv_lens=(8, 8, 8, 8)):
    from tokenring_xdit.ring.agreed_ring import Ring
    from tokenring_xdit.ring.comm import RingPosition

    return Ring(pos=RingPosition(None, 0, 4), comms=None, q_lens=(8,) * 4, settings=(),
                kv_lens=kv_lens)  # fmt: skip


def _spec(device: str, heads: int, kv_heads: int):
    """What resolve_travel reads of an agreed CallSpec: q's and k's shapes, device, layout."""
    import torch

    from tokenring_xdit.ring.tensor_layout import BSHD

    def x(h):
        return SimpleNamespace(shape=(1, 8, h, 16), device=torch.device(device))

    return SimpleNamespace(q=x(heads), k=x(kv_heads), layout=BSHD)


def test_windowed_calls_take_the_rule_and_run_kv_when_forced():
    """A sliding window no longer keeps TokenRing: `auto` picks by the rule, "kv" runs, except
    over K/V of another length than the queries' (refused)."""
    from tokenring_xdit.ring.seam.travel import resolve_travel

    assert resolve_travel("auto", _ring(), _spec("cuda", 32, 8), windowed=True) == "kv"
    assert resolve_travel("auto", _ring(), _spec("cuda", 32, 32), windowed=True) == "q"
    assert resolve_travel("auto", _ring(), _spec("cpu", 32, 8), windowed=True) == "q"
    assert resolve_travel("kv", _ring(), _spec("cpu", 32, 32), windowed=True) == "kv"
    uneven = _ring((8, 6, 8, 8))
    assert resolve_travel("auto", uneven, _spec("cuda", 32, 8), windowed=True) == "q"
    with pytest.raises(NotImplementedError, match="queries' length"):
        resolve_travel("kv", uneven, _spec("cuda", 32, 8), windowed=True)
