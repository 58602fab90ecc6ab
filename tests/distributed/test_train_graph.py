"""The training CUDA-graph switch (RingConfig.train_cuda_graph, ring/training/run.py) on real gloo
ranks. On the CPU nothing is captured (graphs_wanted: CUDA only), so the switch must change
nothing: out, lse, dq, dk, dv bitwise equal with it off, on (config=) and on (environment),
causal zigzag and non-causal, MHA and GQA, fp32 and bf16, each also vs exact fp64; the ring
graph cache stays empty. The switch is agreed: the call's header carries it (the Ring's
settings differ with it), and ranks that differ fail together with one error naming it.
The training benchmark's token_ring_graph method and the train profile's --graph run on the
CPU too. (tests/gpu/test_gpu_train_graph.py checks the replays themselves.)
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed.test_bad_input import _assert_all_raise
from tests.harness import run_cases, run_ranks, values
from tests.speed import scaled

ROOT = Path(__file__).resolve().parents[2]
VAR = "TOKENRING_XDIT_TRAIN_CUDA_GRAPH"
# name, causal, query heads, K/V heads, dtype
CASES = [
    ("causal-mha-fp32", True, 2, 2, "float32"),
    ("causal-gqa-bf16", True, 4, 2, "bfloat16"),
    ("noncausal-mha-bf16", False, 2, 2, "bfloat16"),
    ("noncausal-gqa-fp32", False, 4, 1, "float32"),
]
TOL = {"float32": 2e-5, "bfloat16": 6e-2}  # vs exact fp64 (tests/distributed/test_training)


def _run(torch, case, rank, n, cfg, seed):
    """(out, lse, dq, dk, dv) of this rank's shard, and their max |err| vs exact fp64."""
    from tests.reference import exact_grads
    from tokenring_xdit.ring import token_ring_attn_func
    from tokenring_xdit.ring.split.sharding import shard_positions

    _, causal, h, h_kv, dtype = case
    dtype = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(seed)
    total, d = 8 * n, 32
    q, do = (torch.randn(1, total, h, d, generator=gen).to(dtype) for _ in "qo")
    k, v = (torch.randn(1, total, h_kv, d, generator=gen).to(dtype) for _ in "kv")
    pos = shard_positions(total, rank, n, causal=causal)
    ql, kl, vl = (x[:, pos].clone().requires_grad_() for x in (q, k, v))
    out, lse, _ = token_ring_attn_func(
        ql, kl, vl, causal=causal, positions=pos if causal else None, config=cfg,
        return_attn_probs=True,
    )  # fmt: skip
    out.backward(do[:, pos])
    got = (out.detach(), lse, ql.grad, kl.grad, vl.grad)
    ref = exact_grads(q, k, v, do, causal=causal)
    want = (ref[0], None, *ref[1:])
    errs = [
        (g.double() - w[:, pos]).abs().max().item()
        for g, w in zip(got, want, strict=True)
        if w is not None
    ]
    return got, max(errs)


def _settings(torch, rank, n, cfg) -> tuple:
    """(graphs of the prepared call, the agreed header's graphs field) of a causal training call."""
    from tokenring_xdit.ring.agree.header import RING_SETTINGS
    from tokenring_xdit.ring.seam.prepare import CallOptions, prepare
    from tokenring_xdit.ring.split.sharding import shard_positions

    q, k, v = (torch.randn(1, 8, 2, 16, requires_grad=True) for _ in "qkv")
    pos = shard_positions(8 * n, rank, n, causal=True)
    prepared = prepare(q, k, v, CallOptions(causal=True, positions=pos, config=cfg))
    return prepared.graphs, prepared.ring.settings[RING_SETTINGS.index("graphs")]


def _worker(rank: int, n: int) -> dict:
    import os

    import torch
    import torch.distributed as dist

    from tokenring_xdit.config import RingConfig
    from tokenring_xdit.ring.comm import setup_token_ring_group
    from tokenring_xdit.ring.graph_cache import RING_GRAPHS

    setup_token_ring_group(dist.group.WORLD)
    off, on = RingConfig(train_cuda_graph=False), RingConfig(train_cuda_graph=True)
    result: dict = {"cases": {}}
    for i, case in enumerate(CASES):
        base, base_err = _run(torch, case, rank, n, off, seed=40 + i)
        os.environ[VAR] = "1"  # config.current() re-reads it (config=None: the environment's)
        try:
            runs = {"config": _run(torch, case, rank, n, on, 40 + i),
                    "environment": _run(torch, case, rank, n, None, 40 + i)}  # fmt: skip
        finally:
            del os.environ[VAR]
        result["cases"][case[0]] = {
            "base_err": base_err,
            "errs": {label: err for label, (_, err) in runs.items()},
            "bitwise": {
                label: all(torch.equal(a, b) for a, b in zip(base, got, strict=True))
                for label, (got, _) in runs.items()
            },
        }
    result["settings"] = {
        "off": _settings(torch, rank, n, off),
        "on": _settings(torch, rank, n, on),
    }
    stats = RING_GRAPHS.stats
    result["graphs"] = (len(RING_GRAPHS), stats.captures, stats.replays, list(stats.refused))
    return result


@functools.cache
def _launch(n: int) -> list:
    return values(run_ranks(_worker, n, timeout=240))


@pytest.mark.parametrize("n", [2, 3])
def test_the_switch_changes_nothing_on_the_cpu(n):
    for rank, res in enumerate(_launch(n)):
        for case in CASES:
            got = res["cases"][case[0]]
            assert all(got["bitwise"].values()), (n, rank, case, got)
            for label, err in {"off": got["base_err"], **got["errs"]}.items():
                assert err <= TOL[case[4]], (n, rank, case, label, err)
        assert res["graphs"] == (0, 0, 0, []), (rank, res["graphs"])


@pytest.mark.parametrize("n", [2, 3])
def test_the_switch_reaches_the_agreed_header(n):
    for rank, res in enumerate(_launch(n)):
        assert res["settings"] == {"off": (False, 0), "on": (True, 1)}, (rank, res["settings"])


def _differs(rank: int, n: int, group, how: str) -> str:
    import torch

    from tokenring_xdit.config import RingConfig
    from tokenring_xdit.ring import token_ring_attn_func
    from tokenring_xdit.ring.comm import setup_token_ring_group
    from tokenring_xdit.ring.split.sharding import shard_positions

    setup_token_ring_group(group)
    q, k, v = (torch.randn(1, 8, 2, 16, requires_grad=True) for _ in "qkv")
    pos = shard_positions(8 * n, rank, n, causal=True)
    if how == "config":
        kwargs = dict(config=RingConfig(train_cuda_graph=rank == 1))
    else:  # the per-call override on one rank only
        kwargs = dict(cuda_graph=True) if rank == 1 else {}
    token_ring_attn_func(q, k, v, causal=True, positions=pos, group=group, **kwargs)
    return "no error"


@functools.cache
def _differing() -> dict:
    """Both ways of differing, one launch (tests/harness.py run_cases: a group each)."""
    return run_cases(_differs, 2, ["config", "cuda_graph"], timeout=60)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", ["config", "cuda_graph"])
def test_ranks_that_differ_on_the_switch_fail_together(how):
    results = _differing()[how]
    _assert_all_raise(
        results,
        "ValueError",
        "CUDA graphs on/off",
        "TRAIN_CUDA_GRAPH",
        # the per-call override against rank 0's default (auto: decided after the agreement)
        "rank 0 has off, rank 1 has on" if how == "config" else "rank 0 has auto, rank 1 has on",
    )


def _torchrun(script: str, *argv: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "benchmarks" / script), "--device", "cpu", *argv]  # fmt: skip
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    return subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=scaled(600)
    )


def test_the_training_benchmark_runs_token_ring_graph_beside_the_others(tmp_path):
    """benchmarks/multi_node_train.py's token_ring_graph (the switch on, zigzag shards for
    causal rows) is checked against exact attention and timed beside token_ring and ulysses;
    every rank's graph cache counts reach the JSON (nothing captured on the CPU)."""
    out = tmp_path / "train.json"
    run = _torchrun(
        "multi_node_train.py", "--shapes", "g:4:2:16:causal,m:4:4:16:full", "--seqs", "64",
        "--check", "--check-tokens", "16", "--iters", "1", "--warmup", "1",
        "--methods", "token_ring,token_ring_graph,ulysses", "--out", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(out.read_text())
    methods = ("token_ring", "token_ring_graph", "ulysses")
    assert set(data["checks"]) == {f"{s}/{m}" for s in "gm" for m in methods}
    for key, errs in data["checks"].items():
        assert "error" not in errs and max(errs.values()) < 0.03, (key, errs)  # bf16 vs fp64
    assert {(r["shape"], r["impl"]) for r in data["rows"] if r.get("ms", 0) > 0} == {
        (s, m) for s in "gm" for m in methods
    }
    stats = data["meta"]["graph_stats"]
    assert [s["captures"] for s in stats] == [0, 0] and not any(s["refused"] for s in stats)


def test_the_train_profile_takes_the_switch(tmp_path):
    out = tmp_path / "profile.json"
    run = _torchrun(
        "profile_train_call.py", "--shapes", "g:4:2:16:causal", "--seqs", "64", "--graph", "0",
        "1", "--warmup", "1", "--iters", "1", "--calls", "1", "--out", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert sorted((r["graph"], r["rank"]) for r in rows) == [(g, r) for g in (0, 1) for r in (0, 1)]
    assert all(r["call_ms"] > 0 for r in rows)
    assert "graph 1:" in run.stdout
