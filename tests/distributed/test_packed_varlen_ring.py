"""benchmarks/packed_varlen.py --real-ring end to end: `torchrun --nproc-per-node 2` as the GPU
command is typed, on gloo at a tiny size (fp32, GQA, short documents). Every (layout, kernel) of
the --kernel list and the dense causal ring get a timed row with the plan's per-rank pairs and
the kernel record that ran, and --check's out and gradients of every one match fp64
per-document attention."""

from __future__ import annotations

import json

from tests.harness import torchrun_script

TOL = 2e-5  # fp32, max |err| of out, dq, dk, dv
LAYOUTS = ["zigzag", "documents", "contiguous", "auto"]
KERNELS = ["masked", "auto"]  # on the CPU auto is the masked kernel too
METHODS = [f"{layout}/{kernel}" for layout in LAYOUTS for kernel in KERNELS]
TOKENS = [256, 512]


def test_tiny_real_ring_has_every_layout_and_is_exact(tmp_path):
    out = tmp_path / "ring.json"
    done = torchrun_script(
        "benchmarks/packed_varlen.py",
        "--real-ring", "--device", "cpu", "--tokens", ",".join(map(str, TOKENS)),
        "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--doc-lens", "16,96",
        "--layout", ",".join(LAYOUTS), "--check", "--check-tokens", "256",
        "--warmup", "1", "--iters", "2", "--kernel", ",".join(KERNELS), "--out", str(out),
        timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["meta"]["world_size"] == 2 and result["meta"]["backend"] == "gloo"
    assert result["meta"]["kernel"] == "masked,auto"
    assert "profile_calls" not in result["meta"]
    assert [r["tokens"] for r in result["rows"]] == TOKENS
    for row in result["rows"]:
        cu = row["cu_seqlens"]
        assert cu[0] == 0 and cu[-1] == row["tokens"] and len(cu) - 1 == row["documents"] > 2
        assert row["per_document"] > 0 and row["ideal_ring"] == row["per_document"] / 2
        methods = row["methods"]
        assert set(methods) == {"dense_causal", *METHODS}, sorted(methods)
        for name, entry in methods.items():
            assert entry["ms"] > 0 and entry["efficiency"] > 0, (name, entry)
            assert len(entry["ranks_ms"]) == 2 and min(entry["ranks_ms"]) > 0, (name, entry)
        assert methods["dense_causal"]["predicted_ms"] > 0
        # what auto picks on CUDA half for this row (the cost model), recorded beside the runs
        assert row["auto"]["layout"] in LAYOUTS
        assert row["auto"]["kernel"] in ("flash_varlen", "cudnn")
        assert len(row["auto"]["choices"]) == 6  # 3 layouts x 2 kernels
        for name in METHODS:
            entry = methods[name]
            assert entry["layout_used"] in ("zigzag", "documents", "contiguous")
            assert entry["kernel_used"] == "masked" and entry["predicted_ms"] is None  # unpriced
            assert len(entry["pairs_per_rank"]) == 2 and min(entry["pairs_per_rank"]) > 0
            # exactly the documents' causal pairs, fewer than the dense causal ring's
            want = sum((b - a) * (b - a + 1) // 2 for a, b in zip(cu, cu[1:], strict=False))
            assert sum(entry["pairs_per_rank"]) == want < methods["dense_causal"]["pairs_total"]
            assert entry["speedup_vs_dense_ring"] > 0
            assert "profile" not in entry  # only with --profile
    check = result["check"]
    assert check["tokens"] == 256 and set(check["max_abs"]) == set(METHODS)
    for name, errs in check["max_abs"].items():
        assert set(errs) == {"out", "dq", "dk", "dv"}, errs
        assert all(0 <= e <= TOL for e in errs.values()), (name, errs)
    assert "dense_causal" in done.stdout and "check 256 tokens" in done.stdout
    assert "auto picks" in done.stdout


TIMELINE = {"window_ms", "attention_ms", "nccl_in_the_open_ms",
            "merge_copy_other_in_the_open_ms", "gpu_idle_ms"}  # fmt: skip
PROFILE = {"rank", "call_ms", "timeline", "kernels_ms", "host_issue_ms", "idle_of_window",
           "launches_per_call", "activities_per_call", "predicted_ms", "attention_ms",
           "rest_ms", "work", "events"}  # fmt: skip
WORK = {"pairs", "kernel_calls", "segments", "varlen_calls", "tiles", "predicted_ms",
        "predicted_ms_by_kernel", "q_transfers", "returns"}  # fmt: skip


def test_profile_gives_every_packed_entry_a_per_rank_profile(tmp_path):
    """--profile 2: every packed entry (not the dense ring) gets one profile per rank, in rank
    order, with the timeline, the rank's own timed ms, host issue time, launches and the model's
    per-rank ms (None: the masked kernel is not priced); the per-rank table is printed."""
    out = tmp_path / "ring.json"
    done = torchrun_script(
        "benchmarks/packed_varlen.py",
        "--real-ring", "--device", "cpu", "--tokens", "256", "--heads", "4", "--kv-heads", "2",
        "--head-dim", "16", "--doc-lens", "16,96", "--layout", "zigzag,auto", "--warmup", "1",
        "--iters", "1", "--profile", "2", "--profile-events", "--out", str(out),
        timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["meta"]["profile_calls"] == 2
    methods = result["rows"][0]["methods"]
    assert "profile" not in methods["dense_causal"]
    for name in ("zigzag", "auto"):
        entry = methods[name]
        ranks = entry["profile"]
        assert [p["rank"] for p in ranks] == [0, 1], (name, ranks)
        for p, own_ms in zip(ranks, entry["ranks_ms"], strict=True):
            assert set(p) == PROFILE, sorted(p)
            assert set(p["timeline"]) == TIMELINE, p["timeline"]
            tl = p["timeline"]
            # the window splits into its four parts (the CPU's ops: attention may be 0 there)
            parts = [tl[k] for k in sorted(TIMELINE - {"window_ms"})]
            assert min(parts) >= 0 and tl["gpu_idle_ms"] < tl["window_ms"], tl
            assert abs(sum(parts) - tl["window_ms"]) < 1e-6 * tl["window_ms"], tl
            assert p["call_ms"] == own_ms and p["host_issue_ms"] > 0
            assert p["rest_ms"] == p["call_ms"] - tl["window_ms"]
            assert p["attention_ms"] == tl["attention_ms"]
            assert 0 <= p["idle_of_window"] < 1
            assert 1 <= p["launches_per_call"] <= p["activities_per_call"]
            assert p["predicted_ms"] is None  # masked on the CPU: not priced
            assert p["kernels_ms"]["nccl"] > 0  # gloo's ops: the transfers were profiled
            assert set(p["work"]) == WORK and p["work"]["pairs"] > 0, p["work"]
            # one call's activities (the CPU's ops here), in time order, kinds of the timeline
            starts = [e[2] for e in p["events"]]
            assert len(starts) > 0 and starts == sorted(starts)
            assert abs(len(starts) - p["activities_per_call"]) <= 0.1 * len(starts)
            assert {e[0] for e in p["events"]} <= {"attention", "nccl", "merge", "copy", "other"}
        # the plan's pairs of each rank, as the entry's pairs_per_rank
        assert [p["work"]["pairs"] for p in ranks] == entry["pairs_per_rank"]
    assert "per rank, ms per call" in done.stdout
    assert done.stdout.count("    zigzag    1 ") == 1, done.stdout[-3000:]


def test_balanced_packing_order_runs_exact(tmp_path):
    """--order balanced: the drawn documents packed in balanced_order for the ring's size (the
    same order on both ranks; 4 documents of 1024 tokens: predicted 1.048 -> 1.019 ms), the
    row's zigzag, exact vs fp64."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from packed_varlen import _documents

    from tokenring_xdit.ring.packed.pack_order import balanced_order

    out = tmp_path / "ring.json"
    done = torchrun_script(
        "benchmarks/packed_varlen.py",
        "--real-ring", "--device", "cpu", "--tokens", "1024", "--heads", "4", "--kv-heads", "2",
        "--head-dim", "16", "--doc-lens", "32,640", "--layout", "zigzag", "--check",
        "--check-tokens", "1024", "--order", "balanced", "--warmup", "1", "--iters", "1",
        "--out", str(out),
        timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["meta"]["order"] == "balanced"
    drawn = _documents(1024, 0, 32, 640)
    lengths = [b - a for a, b in zip(drawn, drawn[1:], strict=False)]
    order = balanced_order(lengths, 2)
    assert order != sorted(order)  # a row this uneven is reordered
    cu = result["rows"][0]["cu_seqlens"]
    assert [b - a for a, b in zip(cu, cu[1:], strict=False)] == [lengths[i] for i in order]
    assert result["check"]["tokens"] == 1024  # the check row is this reordered row
    for errs in result["check"]["max_abs"].values():
        assert all(0 <= e <= TOL for e in errs.values()), errs


def test_train_graph_runs_new_packings_per_step_and_degrades_to_eager_on_the_cpu(tmp_path):
    """--train-graph: per step a new packing (fresh lengths, the documents counted per step)
    through --layers calls forward + backward, eager and graphs on timed on the same packings;
    on the CPU graphs cannot run, so cuda_graph=True runs eagerly: the meta says so, the graph
    cache counts nothing and --check finds the two modes bitwise equal, both exact vs fp64."""
    out = tmp_path / "graph.json"
    done = torchrun_script(
        "benchmarks/packed_varlen.py",
        "--real-ring", "--train-graph", "--device", "cpu", "--tokens", "256", "--heads", "4",
        "--kv-heads", "2", "--head-dim", "16", "--doc-lens", "16,96", "--layout",
        "zigzag,documents", "--layers", "3", "--steps", "2", "--check", "--check-tokens", "128",
        "--out", str(out),
        timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    meta = result["meta"]
    assert meta["mode"] == "train_graph" and meta["graphs"].startswith("eager")
    assert (meta["layers"], meta["steps"], meta["world_size"]) == (3, 2, 2)
    zero = {"captures": 0, "replays": 0, "eager": 0, "dropped": 0, "refused": 0}
    (row,) = result["rows"]
    assert row["tokens"] == 256 and set(row["methods"]) == {"zigzag", "documents"}
    for name, entry in row["methods"].items():
        for mode in ("eager", "graph"):
            per_step = entry[f"{mode}_ms_per_call"]
            assert len(per_step) == 2 and min(per_step) > 0, (name, entry)
            assert entry[f"{mode}_ms"] == sum(per_step) / 2
            assert entry[f"{mode}_stats"] == [zero, zero], (name, entry)
        assert entry["speedup"] == entry["eager_ms"] / entry["graph_ms"]
        assert entry["kernel_used"] == ["masked"] * 2 and entry["refused"] == []
        assert entry["layout_used"] == [name] * 2
        assert len(entry["documents"]) == 2 and min(entry["documents"]) > 1
    # the steps' packings are new: the packer draws per step from --seed + step
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from packed_varlen import _documents

    drawn = [len(_documents(256, step, 16, 96)) - 1 for step in range(2)]
    assert row["methods"]["zigzag"]["documents"] == drawn
    assert _documents(256, 0, 16, 96) != _documents(256, 1, 16, 96)
    check = result["check"]
    assert (check["tokens"], check["layers"], check["packings"]) == (128, 3, 2)
    for name, entry in check["max_abs"].items():
        assert set(entry["graph_vs_eager"].values()) == {0.0}, (name, entry)
        for what in ("graph_vs_fp64", "eager_vs_fp64"):
            assert all(0 <= e <= TOL for e in entry[what].values()), (name, what, entry)
        assert entry["graph_stats"] == [zero, zero]
    assert "graph ms" in done.stdout
