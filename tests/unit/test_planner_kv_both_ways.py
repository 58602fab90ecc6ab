"""The planner's model of training calls of both ring families (planner/kv_both_ways.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenring_xdit.planner.kv_both_ways import (
    TrainShape,
    _kv_rows,
    _token_ring_rows,
    pass_bytes,
    train_ms,
)
from tokenring_xdit.planner.machine import make_machine

REPO = Path(__file__).resolve().parents[2]
MEASURED = REPO / "docs/benchmarks/training-ring4-h200-2026-11/train_graph_ring4.json"


@pytest.mark.parametrize("heads,kv_heads", [(32, 8), (32, 32), (4, 1)])
@pytest.mark.parametrize("backward", [False, True])
def test_bytes_per_step_are_what_the_simulated_tables_send(heads, kv_heads, backward):
    """A middle row of each family's simulated table sends what `pass_bytes` says."""
    m, n = make_machine(4), 4
    s = TrainShape(heads, kv_heads, 128, 4096, causal=False)
    for family, rows in (("token_ring", _token_ring_rows(m, s, n, backward)),
                         ("kv_both_ways", _kv_rows(m, s, n, backward))):  # fmt: skip
        middle = rows[2]  # both lanes busy: K/V (and sums), or Q and a partial
        for _kernel, _mem, flows in middle:
            assert sum(b for _, b in flows) == pass_bytes(family, s, n, backward), family


def test_ring_of_one_is_the_same_call_for_both_families():
    m = make_machine(1)
    s = TrainShape(32, 8, 128, 8192, causal=True)
    assert train_ms(m, "token_ring", s, [0]) == train_ms(m, "kv_both_ways", s, [0])


def test_fewer_kv_heads_favour_the_kv_family():
    """Ring 4, 4k tokens per GPU, causal: under GQA 64/8 the K/V family is predicted faster than
    TokenRing, at MHA it is not."""
    m = make_machine(4)
    gqa = TrainShape(64, 8, 128, 4096, causal=True)
    mha = TrainShape(32, 32, 128, 4096, causal=True)
    ms = {(f, s.kv_heads): train_ms(m, f, s, [0, 1, 2, 3])["ms"]
          for f in ("token_ring", "kv_both_ways") for s in (gqa, mha)}  # fmt: skip
    assert ms[("kv_both_ways", 8)] < ms[("token_ring", 8)]
    assert ms[("kv_both_ways", 32)] >= ms[("token_ring", 32)]


def test_token_ring_model_is_near_the_graphed_measurements():
    """The committed graphed TokenRing calls at ring 4 on 4 x H200 within 10 %."""
    rows = [r for r in json.loads(MEASURED.read_text())["rows"] if r["impl"] == "token_ring_graph"]
    assert rows
    m = make_machine(4)
    for r in rows:
        s = TrainShape(r["heads"], r["kv_heads"], r["head_dim"], r["seq"] // 4, r["causal"])
        pred = train_ms(m, "token_ring", s, [0, 1, 2, 3])["ms"]
        assert abs(pred / r["ms"] - 1) < 0.10, (r["shape"], r["seq"], pred, r["ms"])


def test_unknown_family_is_refused():
    with pytest.raises(ValueError, match="kv_both_ways"):
        train_ms(make_machine(2), "ulysses", TrainShape(8, 8, 64, 256, False), [0, 1])


def test_plan_says_what_travels_round_the_best_ring_in_training(capsys):
    """`plan --train` names what `travel="auto"` moves round the best split with a ring: K/V
    under GQA, queries for MHA; nothing for a forward-only plan."""
    import argparse

    from tokenring_xdit.tools import plan_cli

    parser = argparse.ArgumentParser()
    plan_cli.add_arguments(parser)
    said = {}
    for name, flags in (("gqa", "--kv-heads 8 --train"), ("mha", "--train"), ("fwd", "")):
        args = parser.parse_args(f"--heads 32 --head-dim 128 --tokens 16384 --gpus 4 --causal "
                                 f"{flags}".split())  # fmt: skip
        assert plan_cli.run(args) == 0
        said[name] = [x for x in capsys.readouterr().out.splitlines() if "travel:" in x]
    assert len(said["gqa"]) == 1 and "K/V both ways round ulysses" in said["gqa"][0]
    assert len(said["mha"]) == 1 and "queries round ulysses" in said["mha"][0]
    assert said["fwd"] == []
