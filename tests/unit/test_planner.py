"""The planner's cost model, schedules, validation and CLI (CPU only, no torch)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tokenring_xdit.planner.calibration import KernelTable, load_table
from tokenring_xdit.planner.choose import choose_ring
from tokenring_xdit.planner.cost import predict
from tokenring_xdit.planner.machine import make_machine
from tokenring_xdit.planner.plan import rank_all, splits
from tokenring_xdit.planner.schedules import (
    Block,
    RingOptions,
    _kernel,
    old_final_pieces,
    sweep_options,
    token_ring,
)
from tokenring_xdit.planner.validate import MAX_MEDIAN_ERROR, MIN_PICK_RATE, SWEEPS_DIR, validate
from tokenring_xdit.tools import plan_cli as cli

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / SWEEPS_DIR


def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    return p.parse_args(list(argv))


def test_splits_respect_head_divisibility():
    assert splits(24, 8) == [(1, 8), (2, 4), (4, 2), (8, 1)]
    assert splits(16, 6) == [(1, 6), (2, 3)]  # 3 and 6 do not divide 16 heads
    assert all(40 % u == 0 and u * r == 32 for u, r in splits(40, 32))


def test_validate_meets_error_target_on_committed_data():
    checks, picks = validate(BENCH)
    files = {c.file for c in checks}
    assert len(files) >= 9 and len(picks) >= 60
    errors = sorted(abs(c.error) for c in checks)
    assert errors[len(errors) // 2] <= MAX_MEDIAN_ERROR
    assert sum(p[3] for p in picks) >= MIN_PICK_RATE * len(picks)


def test_ulysses_beats_ring_4_on_nvswitch_from_8k_tokens():
    """The decision the 4 x H200 sweep measured: ulysses-4 ahead of every ring from 8k tokens,
    TokenRing ahead at Flux 1024 px (4608 tokens)."""
    m = make_machine(4)
    for tokens in (8192, 16896, 32768):
        uly = predict(m, "ulysses", 24, 128, tokens, 4, 1).ms
        assert uly < predict(m, "token_ring", 24, 128, tokens, 1, 4).ms
    assert (
        predict(m, "token_ring", 24, 128, 4608, 1, 4).ms
        < predict(m, "ulysses", 24, 128, 4608, 4, 1).ms
    )


def test_overlap_cost_grows_with_the_bytes_moved_under_the_kernel():
    m = make_machine(4)
    beta = m.params.overlap_us_per_mb
    assert 3.0 <= beta <= 6.0  # ring_call_profile + nccl_ctas rows span 3.0-5.7 us per MB
    b = Block(heads=24, head_dim=128, q_len=4096, kv_len=4096)
    alone = _kernel(m, b, "cudnn")
    assert _kernel(m, b, "cudnn", 50e6, 0.1) == pytest.approx(alone + beta * 50 / 1e3)
    # a transfer twice as long as the kernel moves half its bytes under it
    long = 2 * alone
    assert _kernel(m, b, "cudnn", 50e6, long) == pytest.approx(alone + beta * 25 / 1e3)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 16, 32, 64])
def test_token_ring_simulates_any_ring_size(n):
    m = make_machine(n)
    b = Block(heads=24, head_dim=128, q_len=65536 // n, kv_len=65536 // n)
    r = token_ring(m, b, list(range(n)))
    one = m.table.block_ms(65536, 65536, 24, 128)
    # never faster than perfect scaling of the single-GPU kernel, never slower than 3x it
    assert one / n * 0.9 <= r.gpu_ms <= 3 * one
    if n > 1:
        assert r.breakdown["comm"] > 0


def test_more_gpus_is_faster_for_long_sequences():
    times = [predict(make_machine(n), "token_ring", 24, 128, 65536, 1, n).ms for n in (2, 4, 8)]
    assert times[0] > times[1] > times[2]


def test_slower_fabric_is_slower():
    fast = predict(make_machine(4, fabric_name="nvswitch"), "token_ring", 24, 128, 16384, 1, 4)
    slow = predict(make_machine(4, fabric_name="pcie"), "token_ring", 24, 128, 16384, 1, 4)
    assert slow.gpu_ms > fast.gpu_ms * 1.5


def test_multi_node_ring_hops_pay_the_inter_node_link():
    one_node = make_machine(16, nodes=1)
    two_nodes = make_machine(16, nodes=2)
    assert two_nodes.link(7, 8).name == "ib" and two_nodes.link(0, 7).name == "nvswitch"
    # 16384 tokens: from ~32k the held-back own block hides even an IB hop's return
    a = predict(one_node, "token_ring", 24, 128, 16384, 8, 2).ms
    b = predict(two_nodes, "token_ring", 24, 128, 16384, 8, 2).ms  # ring over nodes, IB hops
    assert b > a
    ranked = rank_all(make_machine(32, nodes=4), 40, 128, 75600, layers=40, batch=2)
    assert ranked[0].prediction.ulysses * ranked[0].prediction.ring == 32


def test_choose_ring_is_deterministic_and_sane():
    args = (24, 128, 2048, 2048, 4, "bfloat16", "NVIDIA H200", "nvswitch", True)
    assert {choose_ring(*args) for _ in range(5)} == {choose_ring(*args)}
    assert choose_ring(24, 128, 4096, 4096, 1) == "default"
    # small PixArt blocks on 4 GPUs: TokenRing's graph replay wins by a wide margin (measured 5x)
    assert choose_ring(16, 72, 1024, 1024, 4) == "token_ring"
    # eager, host-bound: no graph, nothing to gain over one all-gather
    assert choose_ring(16, 72, 1024, 1024, 4, graphs=False) == "default"


def test_calibration_loader_reads_the_calibrate_script_format(tmp_path):
    cells = ((256, 256, 0.01), (256, 1024, 0.02), (1024, 256, 0.02), (1024, 1024, 0.08))
    rows = [
        dict(kernel="cudnn", dtype="bfloat16", heads=h, head_dim=128, q_len=q, kv_len=kv, ms=ms)
        for h in (16, 32)
        for q, kv, ms in cells
    ]
    path = tmp_path / "blocks_test.json"
    meta = {"source": "measured", "gpu": "NVIDIA H100"}
    path.write_text(json.dumps({"meta": meta, "rows": rows}))
    t = KernelTable.from_json(path)
    assert not t.derived
    assert t.block_ms(1024, 1024, 16, 128) == pytest.approx(0.08)
    assert 0.02 < t.block_ms(512, 1024, 16, 128) < 0.08  # interpolated between grid points
    assert t.block_ms(2048, 2048, 16, 128) > 0.08  # extrapolated upward
    rows.pop()
    path.write_text(json.dumps({"meta": {}, "rows": rows}))
    with pytest.raises(ValueError, match="full q_len x kv_len grid"):
        KernelTable.from_json(path)


def test_final_pieces_rule_and_schedule():
    assert [old_final_pieces(q) for q in (512, 1152, 2048, 4096, 8448)] == [1, 1, 2, 4, 4]
    m = make_machine(2)
    b = Block(heads=24, head_dim=128, q_len=4096, kv_len=4096)
    whole = RingOptions(defer_own=0.0)  # the held-back block would hide both tails
    one = token_ring(m, b, [0, 1], options=whole)
    four = token_ring(m, b, [0, 1], final_pieces=4, options=whole)
    assert four.breakdown["exposed_tail"] < one.breakdown["exposed_tail"]


def test_sweeps_before_the_held_back_block_are_predicted_without_it():
    assert sweep_options("2026-11-22 06:44:37") == RingOptions(defer_own=0.0, head_start_us=0.0)
    now = sweep_options("2026-11-26 05:23:49")
    assert (now.defer_own, now.head_start_us) == (None, 10.0)  # RingConfig's defaults


def test_planner_and_ring_schedules_import_without_torch():
    """The planner simulates the ring's own tables: importing both must not load torch."""
    code = (
        "import sys, tokenring_xdit.planner.choose, tokenring_xdit.planner.cost, "
        "tokenring_xdit.ring.schedules, tokenring_xdit.ring.head_start; "
        "print('torch' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False"]


def test_held_back_block_hides_the_last_return():
    """defer_own (ring/schedules/token_ring.py's held_back): step 0 runs the own block for the
    first queries only and the rest after the last partial left, which then travels behind it."""
    m, b = make_machine(2), Block(heads=24, head_dim=128, q_len=4096, kv_len=4096)
    off = RingOptions(defer_own=0.0, head_start_us=0.0)
    whole = token_ring(m, b, [0, 1], options=off)
    held = token_ring(m, b, [0, 1], options=RingOptions(defer_own=0.25, head_start_us=0.0))
    assert whole.breakdown["exposed_tail"] > 0 and held.breakdown["exposed_tail"] == 0
    assert held.breakdown["kernels"] > whole.breakdown["kernels"]  # the tail block, in pieces
    # auto (None) holds back a quarter from 2048 local queries and nothing below
    auto = RingOptions(defer_own=None, head_start_us=0.0)
    assert token_ring(m, b, [0, 1], options=auto) == held
    small = Block(heads=24, head_dim=128, q_len=1024, kv_len=1024)
    assert token_ring(m, small, [0, 1], options=auto) == token_ring(m, small, [0, 1], options=off)


@pytest.mark.parametrize(("q_len", "pause_ms"), [(256, 0.0), (4096, 0.010)])
def test_head_start_pauses_where_the_loop_does(q_len, pause_ms):
    """Ring 4, one piece, nothing held back: one pause (step 2, after the first return), and
    only before blocks the ring's gate (ring/head_start.py, 1e10 FLOP) lets through."""
    m, b = make_machine(4), Block(heads=24, head_dim=128, q_len=q_len, kv_len=q_len)
    ranks = [0, 1, 2, 3]
    off = token_ring(m, b, ranks, options=RingOptions(defer_own=0.0, head_start_us=0.0))
    on = token_ring(m, b, ranks, options=RingOptions(defer_own=0.0, head_start_us=10.0))
    assert on.gpu_ms - off.gpu_ms == pytest.approx(pause_ms, abs=1e-9)


def test_shipped_table_is_measured_and_matches_single_gpu_columns():
    t = load_table("NVIDIA H200")
    # the measured table (calibrate_blocks.py) is preferred over blocks_h200_derived.json
    assert not t.derived and t.path.endswith("blocks_h200.json")
    # sweep single_ms: flux 24 x 128 at 16896 tokens ~5.5 ms, pixart 16 x 72 at 16384 ~3.3 ms
    assert t.block_ms(16896, 16896, 24, 128) == pytest.approx(5.5, rel=0.1)
    assert t.block_ms(16384, 16384, 16, 72) == pytest.approx(3.3, rel=0.1)


def test_cli_plan_prints_flags_of_the_best(capsys):
    assert cli.run(_parse("--model", "flux", "--resolution", "2048", "--gpus", "4")) == 0
    out = capsys.readouterr().out
    assert "--ulysses_degree" in out and "ContextParallelConfig(ulysses_degree=" in out
    assert cli.run(_parse("--heads", "24", "--gpus", "4", "--tokens", "4096")) == 2


def test_cli_validate_last_line_format(capsys):
    cli.run(_parse("--validate", "--bench-dir", str(BENCH)))
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("median abs error ") and " best pick right in " in last
