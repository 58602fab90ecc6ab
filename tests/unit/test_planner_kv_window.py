"""The planner's model of the K/V family's sliding-window training calls (planner/kv_window.py)."""

from __future__ import annotations

import pytest

from tokenring_xdit.planner.kv_both_ways import TrainShape, train_ms
from tokenring_xdit.planner.kv_window import kv_plan_for, kv_window_train_ms
from tokenring_xdit.planner.machine import make_machine
from tokenring_xdit.planner.window import window_train_ms

HEAD_HALVES, TOKEN_HALVES = (32, 8), (24, 3)  # (heads, kv_heads): an odd K/V count cuts tokens


@pytest.mark.parametrize("heads,kv_heads", [HEAD_HALVES, TOKEN_HALVES])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_a_window_covering_the_sequence_is_the_full_causal_call(n, heads, kv_heads):
    """W >= S hides nothing: every block runs, every transfer is kept, and the price is
    kv_both_ways' K/V family call to the last digit."""
    m, local = make_machine(n), 2048
    s = TrainShape(heads, kv_heads, 128, local, causal=True)
    ranks = list(range(n))
    full = train_ms(m, "kv_both_ways", s, ranks)["ms"]
    for window in (n * local, 3 * n * local, None):
        assert kv_window_train_ms(m, s, ranks, window)["ms"] == pytest.approx(full, rel=1e-12)


@pytest.mark.parametrize("heads,kv_heads,kernels,hops", [(*HEAD_HALVES, 16, 6),
                                                         (*TOKEN_HALVES, 10, 3)])  # fmt: skip
def test_ring_4_inside_a_chunk_runs_what_the_schedules_note_says(heads, kv_heads, kernels, hops):
    """The windows' Note of schedules/kv_both_ways.py, ring 4, W inside a chunk: head halves run
    16 of 28 kernels a pass and each half crosses the ring (3 hops each way); token halves with
    W - 1 <= L/4 run 10 and A never leaves home (B's 3 hops)."""
    m = make_machine(4)
    for local, window in ((8192, 3), (8192, 1024), (32768, 128)):
        got = kv_window_train_ms(m, TrainShape(heads, kv_heads, 128, local, True), [0, 1, 2, 3],
                                 window)  # fmt: skip
        assert (got["kernels"], got["kv_hops"], got["steps_run"]) == (kernels, hops, 3)
    full = kv_window_train_ms(m, TrainShape(heads, kv_heads, 128, 8192, True), [0, 1, 2, 3], None)
    assert (full["kernels"], full["kv_hops"]) == (28, 6)
    plan = kv_plan_for(4, 8192, 3, kv_heads)
    assert sum(plan.kernel_calls(r) for r in range(4)) == kernels


@pytest.mark.parametrize("window", [128, 1024, 4096])
def test_transfers_grow_with_the_shard_not_the_window(window):
    """On zigzag shards a half crosses the whole ring whatever W is: what a rank sends is the
    same for every W inside a chunk and doubles with its shard."""
    m, n = make_machine(8), 8
    got = [kv_window_train_ms(m, TrainShape(32, 8, 128, local, True), list(range(n)), w)
           for local in (16384, 32768) for w in (window, 128)]  # fmt: skip
    assert got[0]["sent_mb"] == pytest.approx(got[1]["sent_mb"])
    assert got[2]["sent_mb"] == pytest.approx(2 * got[0]["sent_mb"])


WINDOWS = (1, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


@pytest.mark.parametrize("n", [4, 8])
def test_time_grows_with_the_window_when_bands_run_at_the_dense_rate(n):
    """With the band kernel at cuDNN's rate a wider (tile-aligned) window within a shard never
    costs less, and no window costs over the full causal call by more than a few % (a banded
    block near the whole is priced by its tiles, the whole one by its measured block)."""
    m, local = make_machine(n), 16384 // n
    s, ranks = TrainShape(32, 8, 128, local, causal=True), list(range(n))
    times = [kv_window_train_ms(m, s, ranks, w, band_kernel="cudnn")["ms"] for w in WINDOWS]
    inside = [t for w, t in zip(WINDOWS, times, strict=True) if w <= local]
    assert inside == sorted(inside), list(zip(WINDOWS, times, strict=False))
    full = kv_window_train_ms(m, s, ranks, None)["ms"]
    assert max(times) <= 1.05 * full and inside[-1] < full


def test_gqa_moves_fewer_bytes_than_tokenring_on_the_same_shards():
    """GQA 32/8 on zigzag shards: the K/V family sends 4x fewer bytes per step than TokenRing's
    queries, and a small window leaves both going round the ring."""
    m, s = make_machine(8), TrainShape(32, 8, 128, 16384, causal=True)
    kv = kv_window_train_ms(m, s, list(range(8)), 128)
    tr = window_train_ms(m, s, list(range(8)), 128, "zigzag")
    assert kv["sent_mb"] < tr["sent_mb"] / 2
    assert kv["ms"] < tr["ms"]


def test_bad_input_is_named():
    m, s = make_machine(4), TrainShape(32, 8, 128, 1024, causal=True)
    with pytest.raises(ValueError, match="at least 1 token"):
        kv_window_train_ms(m, s, [0, 1, 2, 3], 0)
    with pytest.raises(ValueError, match="causal over two or more"):
        kv_window_train_ms(m, TrainShape(32, 8, 128, 1024, causal=False), [0, 1, 2, 3], 128)
    with pytest.raises(ValueError, match="causal over two or more"):
        kv_window_train_ms(make_machine(1), s, [0], 128)
