"""benchmarks/plot_multi_node.py's data side (no matplotlib): every launch of a stand-in folder
becomes a column with its link, training and forward rows, for one-GPU "nodes" (ring only) and
for 2 GPUs per node (ulysses inside x ring across, train_sweep's JSON)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.plot_multi_node import columns  # noqa: E402

BENCH = ROOT / "docs" / "benchmarks"


def test_the_four_gpu_folder_has_a_column_per_launch_with_its_network():
    cols = {c.setting: c for c in columns(BENCH / "across-nodes-standin-4xh200-2026-11-26")}
    assert set(cols) == {"2x2_u2_default", "2x2_u2_wide", "4x1_wide"}
    # 2 GPUs per node: the probe's pairs are NVLink (~50 GB/s); the title gives the network
    wide = cols["2x2_u2_wide"]
    assert "2 x 2 GPU" in wide.title and "network 4.2 GB/s" in wide.title
    assert (
        "4 x 1 GPU" in cols["4x1_wide"].title and "link 4.0 GB/s one way" in cols["4x1_wide"].title
    )
    # train_sweep rows (causal and not under one shape name) and multi_node_train rows
    labels, values = wide.train
    assert "llama-8b-heads causal 16k" in labels and "llama-8b-heads 128k" in labels
    assert {"token_ring", "yunchang_basic", "ulysses"} <= set(values)
    i = labels.index("llama-8b-heads causal 16k")
    assert abs(values["token_ring"][i] - 36.35) < 0.01
    assert "mha-32c 64k" in cols["4x1_wide"].train[0]
    # the default-socket training run did not finish: forward only
    assert cols["2x2_u2_default"].train == ([], {}) and len(cols["2x2_u2_default"].forward[0]) == 8
    assert all(len(v) == 8 for v in cols["4x1_wide"].forward[1].values())


def test_the_two_gpu_folder_still_plots_with_its_repeat_runs():
    cols = {c.setting: c for c in columns(BENCH / "across-nodes-standin-2xh200-2026-11-26")}
    assert {"socket_default", "socket_wide", "socket_default_run2"} <= set(cols)
    assert "link 4.3 GB/s one way" in cols["socket_default"].title
    assert "link 4.3 GB/s one way" in cols["socket_default_run2"].title  # matched by launch
    assert cols["socket_wide"].train[0] and cols["socket_wide_run2"].train == ([], {})
