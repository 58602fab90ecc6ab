"""The window value and its predicates, against brute force over positions."""

from __future__ import annotations

import itertools

import pytest

from tokenring_xdit.ring.schedules.window import ALL_VISIBLE, NONE, SOME, Window, band_of, relation


def test_window_of_normalises_and_refuses():
    assert Window.of((-1, -1), causal=False) is None
    assert Window.of((-1, -1), causal=True) is None
    assert Window.of((-1, 5), causal=True) is None  # causal forces right = 0: nothing left
    assert Window.of((127, 0), causal=True) == Window(127, 0)
    assert Window.of((127, 9), causal=True) == Window(127, 0)
    assert Window.of((3, 2), causal=False) == Window(3, 2)
    assert Window.of((-1, 0), causal=False) == Window(-1, 0)
    for bad in ((-2, 0), (1,), "ab", (1.5, 0), (True, 0)):
        with pytest.raises(ValueError, match="window_size"):
            Window.of(bad, causal=False)


@pytest.mark.parametrize("left, right", [(0, 0), (2, 0), (3, 1), (-1, 2), (4, -1), (0, 5)])
def test_relation_and_band_match_brute_force(left, right):
    w = Window(left, right)
    spans = [(a, b) for a, b in itertools.combinations(range(0, 13, 2), 2)]
    for q, k in itertools.product(spans, spans):
        pairs = [(qp, kp) for qp in range(*q) for kp in range(*k)]
        seen = [w.visible(qp, kp) for qp, kp in pairs]
        want = ALL_VISIBLE if all(seen) else SOME if any(seen) else NONE
        assert relation(q, k, w.lo, w.hi) == want, (q, k)
        lo, hi = band_of(q[0], k[0], w.lo, w.hi)
        for (qp, kp), vis in zip(pairs, seen, strict=True):
            d = (qp - q[0]) - (kp - k[0])
            assert ((lo is None or d >= lo) and (hi is None or d <= hi)) == vis
