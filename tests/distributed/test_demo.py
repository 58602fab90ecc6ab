"""The demo end to end on spawned CPU ranks (gloo), and the launcher's failure handling."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.speed import scaled
from tokenring_xdit.tools import cli
from tokenring_xdit.tools.launch import LaunchError, launch

SMALL = "--device cpu --heads 2 --head-size 16 --iters 2 --warmup 1 --no-progress --timeout"
SMALL = [*SMALL.split(), f"{scaled(120):.0f}"]


@pytest.mark.parametrize("nproc, tokens", [(2, 256), (3, 96)])
def test_demo_end_to_end(nproc, tokens, tmp_path, capsys):
    path = tmp_path / "results.json"
    argv = ["demo", "--nproc", str(nproc), "--tokens", str(tokens), "--json", str(path), *SMALL]
    assert cli.main(argv) == cli.EXIT_OK, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "TokenRing" in out and "yunchang ring" in out and "single process" in out
    summary = json.loads(path.read_text())
    assert summary["passed"] is True and summary["world_size"] == nproc
    assert summary["environment"]["backend"] == "gloo"
    results = {r["method"]: r for r in summary["results"]}
    assert set(results) == {"single", "tokenring", "yunchang"}
    for name in ("tokenring", "yunchang"):
        assert results[name]["ranks"] == nproc
        assert results[name]["max_err_out"] < 1e-5, results[name]
        assert results[name]["max_err_lse"] < 1e-5, results[name]
    assert all(r["ms_per_call"] > 0 for r in results.values())


def _echo(rank, world_size, report, payload):
    import torch
    import torch.distributed as dist

    report(description="working", total=1)
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    report(advance=1)
    return payload, rank, world_size, t.item()


def _rank1_raises_rank0_waits(rank, world_size, report):
    import torch.distributed as dist

    if rank == 1:
        raise ValueError("bad input on rank 1")
    dist.barrier()  # never completes: rank 1 is gone
    return "unreachable"


def _rank1_dies(rank, world_size, report):
    import torch.distributed as dist

    if rank == 1:
        os._exit(7)  # no exception, no report: a crash
    dist.barrier()
    return "unreachable"


def _sleeps(rank, world_size, report):
    time.sleep(600)


def test_launch_returns_values_in_rank_order():
    events = []
    values = launch(
        _echo,
        2,
        ("hi",),
        timeout=scaled(120),
        on_progress=lambda rank, fields: events.append((rank, fields)),
    )
    assert values == [("hi", 0, 2, 3.0), ("hi", 1, 2, 3.0)]
    assert {rank for rank, _ in events} == {0, 1}
    assert any(fields.get("advance") == 1 for _, fields in events)


def test_launch_reports_a_failing_rank_and_kills_the_blocked_one():
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(_rank1_raises_rank0_waits, 2, timeout=scaled(120))
    assert time.monotonic() - start < scaled(60)  # the grace period, not the timeout
    failures = {f.rank: f for f in info.value.failures}
    assert failures[1].error_type == "ValueError"
    assert "bad input on rank 1" in str(failures[1])
    assert "_rank1_raises_rank0_waits" in failures[1].trace


def test_launch_reports_a_silent_crash():
    with pytest.raises(LaunchError) as info:
        launch(_rank1_dies, 2, timeout=scaled(120))
    failures = {f.rank: f for f in info.value.failures}
    assert failures[1].error_type == "ProcessDied" and "code 7" in failures[1].message


def test_launch_times_out_instead_of_hanging():
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(_sleeps, 2, timeout=5)  # the point: this deadline is kept, not stretched
    assert time.monotonic() - start < scaled(30)
    assert {f.error_type for f in info.value.failures} == {"TimeoutError"}
