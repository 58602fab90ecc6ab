"""Which packed-document graphs the ring keeps (graphs.py: PackingWindow, GraphCache.drop,
run_graphed's `packing`), without a GPU: per ring the graphs of its last PACKINGS_KEPT packings
in the order first seen, older ones dropped when a new packing comes, rings apart. The cache
runs with plain CPU "graphs" (a replay computes the outputs from the static inputs)."""

from __future__ import annotations

import pytest
import torch

from tokenring_xdit.ring import graph_cache as graphs
from tokenring_xdit.ring.graph_cache import PACKINGS_KEPT, GraphCache, PackingWindow, _Graph


def test_a_window_keeps_the_last_packings_of_each_ring():
    window = PackingWindow(2)
    assert window.admit("ring", "p1", "p1-fwd") == []
    assert window.admit("ring", "p1", "p1-bwd") == []
    assert window.admit("ring", "p2", "p2-fwd") == []
    assert sorted(window.admit("ring", "p3", "p3-fwd")) == ["p1-bwd", "p1-fwd"]
    # another ring has its own window: its packings push none of this ring's out
    assert window.admit("other", "q1", "q1-fwd") == []
    assert window.admit("other", "q2", "q2-fwd") == []
    assert window.admit("other", "q3", "q3-fwd") == ["q1-fwd"]
    assert window.admit("ring", "p4", "p4-fwd") == ["p2-fwd"]


def test_the_order_is_first_seen_so_a_forward_ahead_keeps_the_pending_backward():
    """A forward of batch i+1 before the backward of batch i (pipeline 1F1B): using packing i
    again must not make it newer than i+1; packing i+2 drops i, whose backward ran."""
    window = PackingWindow(2)
    window.admit("ring", "i", "i-fwd")
    window.admit("ring", "i+1", "i+1-fwd")
    assert window.admit("ring", "i", "i-bwd") == []
    assert sorted(window.admit("ring", "i+2", "i+2-fwd")) == ["i-bwd", "i-fwd"]
    assert window.admit("ring", "i+1", "i+1-bwd") == []


def test_the_ring_keeps_two_packings():
    assert PACKINGS_KEPT == 2


class _Doubling:
    """A plain CPU "graph": its replay writes 2 x the static input into the static output."""

    def __init__(self, static_in: torch.Tensor, static_out: torch.Tensor) -> None:
        self.static_in, self.static_out = static_in, static_out

    def replay(self) -> None:
        self.static_out.copy_(self.static_in * 2)


def _graph() -> _Graph:
    static_in, static_out = torch.zeros(3), torch.zeros(3)
    return _Graph(_Doubling(static_in, static_out), [static_in], [static_out], None)


def test_drop_removes_those_keys_only_and_counts_graphs():
    cache = GraphCache(lru=8)
    cache._graphs.update({"a": _graph(), "b": _graph(), "eager": None})
    assert cache.drop(["a", "eager", "absent"]) == 1  # the eager entry is no graph
    assert len(cache) == 1 and cache.stats.dropped == 1
    x = torch.arange(3.0)
    assert torch.equal(cache("b", [x], None, None)[0], x * 2)  # the kept one still replays
    assert cache.stats.replays == 1


@pytest.fixture
def ring_cache(monkeypatch):
    cache, window = GraphCache(lru=64), PackingWindow(PACKINGS_KEPT)
    monkeypatch.setattr(graphs, "RING_GRAPHS", cache)
    monkeypatch.setattr(graphs, "RING_PACKINGS", window)
    return cache, window


def test_run_graphed_drops_the_oldest_packing_when_a_new_one_comes(ring_cache):
    """Two packings' graphs replay; the third packing's first call drops the first's (its key
    is gone from the cache) and keeps the second's."""
    cache, window = ring_cache
    x = torch.arange(3.0)
    for packing in ("p1", "p2"):
        for half in ("fwd", "bwd"):
            key = (packing, half)
            window.admit("group", packing, key)
            cache._graphs[key] = _graph()  # as if its first call had captured it
    for packing in ("p1", "p2"):
        out = graphs.run_graphed((packing, "fwd"), (x,), None, "group", packing)
        assert torch.equal(out[0], x * 2)
    assert cache.stats.dropped == 0 and len(cache) == 4
    # p3's first call: p1's graphs go before it runs (here with an eager entry, no capture)
    cache._graphs[("p3", "fwd")] = None
    out = graphs.run_graphed(("p3", "fwd"), (x,), lambda xs: (xs[0] + 1,), "group", "p3")
    assert torch.equal(out[0], x + 1)
    assert cache.stats.dropped == 2 and cache.stats.eager == 1
    assert set(cache._graphs) == {("p2", "fwd"), ("p2", "bwd"), ("p3", "fwd")}
    # a call without a packing (a dense call) leaves the window alone
    cache._graphs["dense"] = _graph()
    graphs.run_graphed("dense", (x,), None, "group")
    assert cache.stats.dropped == 2 and "dense" in cache._graphs


def test_clear_graphs_forgets_the_window(ring_cache):
    cache, window = ring_cache
    window.admit("group", "p1", "k1")
    graphs.clear_graphs()
    # without the clear, p3 would push p1 ("k1") out
    assert window.admit("group", "p2", "k2") == [] and window.admit("group", "p3", "k3") == []


def test_keep_alive_is_nothing_outside_a_capture():
    graphs.keep_alive(torch.zeros(1))  # no capture under way: nothing kept, nothing raised
    assert getattr(graphs._CAPTURING, "kept", None) is None


def test_the_lru_counts_each_group_apart(monkeypatch):
    """A rank in two rings: the keys of one ring never push another ring's graphs out (each
    ring's ranks see the same sequence of their own keys only; a drop one of them made alone
    would make it capture, a collective, while its peers replay)."""
    cache = GraphCache(lru=2)
    monkeypatch.setattr(cache, "_capture", lambda key, leaves, run, group: _graph())
    x = torch.arange(3.0)
    for group, key in (("A", "a1"), ("A", "a2"), ("B", "b1"), ("B", "b2"), ("B", "b3")):
        cache(key, [x], lambda xs: (xs[0],), group)
    assert set(cache._graphs) == {"a1", "a2", "b2", "b3"}
    cache("a1", [x], None, "A")  # a replay: a1 is now A's most recently used
    cache("a3", [x], lambda xs: (xs[0],), "A")
    assert set(cache._graphs) == {"a1", "a3", "b2", "b3"}
    assert cache.drop(["b2"]) == 1 and "b2" not in cache._group
