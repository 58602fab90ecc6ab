"""The interval arithmetic behind benchmarks/profile_ring_call.py's timeline."""

from __future__ import annotations

import itertools
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # sibling imports

from profile_ring_call import breakdown, in_the_open, length, overlap, union  # noqa: E402


def _covered(intervals, t):
    return any(s <= t < e for s, e in intervals)


def test_union_and_overlap_agree_with_a_point_count():
    rng = random.Random(0)
    for _ in range(200):
        a = [(s, s + rng.randint(1, 15)) for s in (rng.randint(0, 80) for _ in range(6))]
        b = [(s, s + rng.randint(1, 15)) for s in (rng.randint(0, 80) for _ in range(6))]
        points = range(0, 100)
        assert length(a) == sum(_covered(a, t) for t in points)
        assert overlap(a, b) == sum(_covered(a, t) and _covered(b, t) for t in points)
        assert in_the_open(a, b) == sum(_covered(a, t) and not _covered(b, t) for t in points)
        merged = union(a)
        assert all(x[1] < y[0] for x, y in itertools.pairwise(merged))


def test_breakdown_splits_one_window():
    ms = 1_000_000  # ns
    by_kind = {
        "attention": [(0, 4 * ms), (5 * ms, 8 * ms)],
        "nccl": [(1 * ms, 2 * ms), (8 * ms, 9 * ms)],  # 1 ms hidden, 1 ms in the open
        "merge": [(9 * ms, 9 * ms + ms // 2)],
        "copy": [(3 * ms, 3 * ms + ms // 2)],  # under attention
    }
    got = breakdown(by_kind, calls=1)
    assert got["window_ms"] == 9.5
    assert got["attention_ms"] == 7.0
    assert got["nccl_in_the_open_ms"] == 1.0
    assert got["merge_copy_other_in_the_open_ms"] == 0.5
    assert got["gpu_idle_ms"] == 1.0  # (4, 5) ms: nothing ran
    assert breakdown({}, calls=3) == {}
