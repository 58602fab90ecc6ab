"""The planner's model of sliding-window training calls (planner/window.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tokenring_xdit.planner.kv_both_ways import TrainShape, train_ms
from tokenring_xdit.planner.machine import make_machine
from tokenring_xdit.planner.window import (
    SPLITS,
    TILE,
    pick_split,
    plan_for,
    q_rows,
    tile_share,
    ulysses_window_ms,
    window_train_ms,
)
from tokenring_xdit.ring.packed.window_traffic import window_traffic


def _brute_share(n_q: int, n_k: int, lo, hi) -> float:
    a, b = np.meshgrid(np.arange(n_q), np.arange(n_k), indexing="ij")
    d = a - b
    seen = np.ones_like(d, dtype=bool)
    if lo is not None:
        seen &= d >= lo
    if hi is not None:
        seen &= d <= hi
    tiles = {(i // TILE, j // TILE) for i, j in zip(*np.nonzero(seen), strict=True)}
    return len(tiles) / (math.ceil(n_q / TILE) * math.ceil(n_k / TILE))


@pytest.mark.parametrize(
    "n_q,n_k,lo,hi",
    [(300, 500, 0, 127), (256, 256, 0, None), (512, 300, -40, 3), (384, 384, None, -200),
     (200, 700, 150, 260), (640, 128, 0, 0), (130, 130, None, None)],
)  # fmt: skip
def test_tile_share_counts_the_tiles_holding_a_visible_pair(n_q, n_k, lo, hi):
    assert tile_share(n_q, n_k, lo, hi) == pytest.approx(_brute_share(n_q, n_k, lo, hi))


@pytest.mark.parametrize("n", [2, 4, 8])
def test_a_window_covering_the_sequence_is_the_full_causal_call(n):
    """W >= S hides nothing: the plan keeps every block and transfer, and the price is
    kv_both_ways' TokenRing call to the last digit."""
    m, local = make_machine(n), 2048
    s = TrainShape(32, 8, 128, local, causal=True)
    ranks = list(range(n))
    full = train_ms(m, "token_ring", s, ranks)["ms"]
    for window in (n * local, 3 * n * local, None):
        assert window_train_ms(m, s, ranks, window)["ms"] == pytest.approx(full, rel=1e-12)
    for split in SPLITS:
        assert (window_train_ms(m, s, ranks, n * local, split)["ms"]
                == window_train_ms(m, s, ranks, None, split)["ms"])  # fmt: skip
    uly = ulysses_window_ms(m, 32, 8, 128, n * local, n, None)["ms"]
    assert ulysses_window_ms(m, 32, 8, 128, n * local, n, n * local)["ms"] == uly


# tile-aligned windows (a window one token short of a shard prices its diagonal by tiles, a
# few % over the measured causal block the full shard gets: planner/window.py)
WINDOWS = (1, 128, 256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384)


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("n", [4, 8])
def test_time_grows_with_the_window_when_bands_run_at_the_dense_rate(n, split):
    """With the band kernel at cuDNN's rate a wider (tile-aligned) window never costs less, up
    to the full causal call (the price follows the visible tiles, the plan's blocks and its
    transfers)."""
    m, local = make_machine(n), 16384 // n
    s = TrainShape(32, 8, 128, local, causal=True)
    ranks = list(range(n))
    times = [window_train_ms(m, s, ranks, w, split, band_kernel="cudnn")["ms"] for w in WINDOWS]
    times.append(window_train_ms(m, s, ranks, None, split)["ms"])
    assert times == sorted(times), list(zip(WINDOWS, times, strict=False))
    uly = [ulysses_window_ms(m, 32, 8, 128, n * local, n, w, "cudnn")["ms"] for w in WINDOWS]
    uly.append(ulysses_window_ms(m, 32, 8, 128, n * local, n, None)["ms"])
    assert uly == sorted(uly)


@pytest.mark.parametrize("split", SPLITS)
def test_time_grows_with_the_window_up_to_a_shard_on_the_band_kernel(split):
    """Priced on torch's flash op (what runs bands today) the time grows with W while the
    window is within a shard (beyond it blocks turn whole again and go back to cuDNN)."""
    m, local = make_machine(4), 4096
    s = TrainShape(64, 8, 128, local, causal=True)
    times = [window_train_ms(m, s, [0, 1, 2, 3], w, split)["ms"] for w in WINDOWS if w <= local]
    assert times == sorted(times)
    assert times[-1] < window_train_ms(m, s, [0, 1, 2, 3], None, split)["ms"]


@pytest.mark.parametrize("window", [2, 128, 1024, 4096])
def test_contiguous_transfers_are_bounded_by_the_window_not_the_sequence(window):
    """On contiguous shards a query travels with the W - 1 rows the window reaches, one hop:
    the bytes a rank sends do not change with the sequence; on the zigzag they grow with it."""
    m, n = make_machine(4), 4
    s = [TrainShape(32, 8, 128, local, causal=True) for local in (8192, 32768)]
    cont = [window_train_ms(m, x, list(range(n)), window, "contiguous") for x in s]
    assert [c["q_rows"] for c in cont] == [window - 1] * 2
    assert cont[0]["sent_mb"] == pytest.approx(cont[1]["sent_mb"])
    assert cont[0]["comm_ms"] == pytest.approx(cont[1]["comm_ms"])
    zig = [window_train_ms(m, x, list(range(n)), window, "zigzag") for x in s]
    assert [z["q_rows"] for z in zig] == [x.tokens for x in s]
    assert zig[1]["sent_mb"] == pytest.approx(4 * zig[0]["sent_mb"])


@pytest.mark.parametrize("split", SPLITS)
def test_a_window_of_one_token_moves_nothing(split):
    m, s = make_machine(4), TrainShape(32, 8, 128, 4096, causal=True)
    got = window_train_ms(m, s, [0, 1, 2, 3], 1, split)
    assert (got["q_rows"], got["sent_mb"], got["steps_run"]) == (0, 0.0, 1)


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("window", [128, 3000, 9000, None])
def test_the_priced_blocks_are_the_plans(split, window):
    """The steps and kernels priced are those the plan runs (window_traffic counts them)."""
    m, n, local = make_machine(8), 8, 2048
    s = TrainShape(32, 8, 128, local, causal=True)
    got = window_train_ms(m, s, list(range(n)), window, split)
    size = (-1, -1) if window is None else (window - 1, 0)
    want = window_traffic(n, local, size, True, split)
    assert (got["steps_run"], got["kernels"]) == (want["steps_run"], want["kernels"])
    assert got["q_rows"] == q_rows(plan_for(n, local, window, split), local)


def test_auto_split_prices_both():
    """Contiguous shards win a small window (no Q round the ring); the zigzag the full call."""
    m = make_machine(8)
    s = TrainShape(32, 8, 128, 16384, causal=True)
    assert pick_split(m, s, list(range(8)), 128)[0] == "contiguous"
    assert pick_split(m, s, list(range(8)), None)[0] == "zigzag"


def test_bad_input_is_named():
    m, s = make_machine(4), TrainShape(32, 8, 128, 1024, causal=True)
    with pytest.raises(ValueError, match="split must be one of"):
        window_train_ms(m, s, [0, 1, 2, 3], 128, "documents")
    with pytest.raises(ValueError, match="at least 1 token"):
        window_train_ms(m, s, [0, 1, 2, 3], 0)
    with pytest.raises(ValueError, match="causal over two or more"):
        window_train_ms(m, TrainShape(32, 8, 128, 1024, causal=False), [0, 1, 2, 3], 128)
