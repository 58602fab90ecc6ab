"""The host work of a packed training call, measured by
benchmarks/diagnostics/hot_path_host.py --path packed for real on 4 gloo ranks at a few calls:
every call runs both loops through the per-segment wrapper (what cuDNN per segment runs on a
GPU), and what depends only on the agreed layout is made once, not per call: the cu_seqlens
check, the plan's transfer flags, the wrapped kernel record, the segments' cuts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import hot_path_host

ROOT = Path(__file__).resolve().parents[2]


def _calls(row: dict, module: str, fn: str) -> float:
    """Calls per packed call of tokenring_xdit/ring/<module>'s `fn` (0 if never called)."""
    prefix = f"tokenring_xdit/ring/{module}:"
    found = [
        n for k, n in row["calls_per_call"].items() if k.startswith(prefix) and k.endswith(f":{fn}")
    ]
    return sum(found)


@pytest.mark.timeout(600)
def test_packed_call_host_work(tmp_path):
    row = hot_path_host(
        tmp_path / "packed.json", "--path", "packed", "--ranks", "4", "--repeats", "12", "--top",
        "5", "--label", "test",
    )  # fmt: skip
    assert row["ranks"] == 4 and row["validate"] == "signature" and row["label"] == "test"
    assert row["version"] == "packed fwd+bwd (cpu_flash_segments)"
    assert len(row["cu_seqlens"]) == 8 and row["cu_seqlens"][-1] == 256  # 7 documents
    assert 0 < row["cpu_us"] and 0 < row["median_us"] <= row["p90_us"]
    assert row["python_calls_per_call"] > 100
    # rank 0: forward and backward loops, its 5 segments run one by one in each
    assert _calls(row, "training/block_loop.py", "run_blocks") == 2
    assert _calls(row, "kernels/sdpa.py", "_cpu_forward") == 5
    assert _calls(row, "kernels/sdpa.py", "_cpu_backward") == 5
    # made once per agreed layout, never per call
    for module, fn in (
        ("packed/documents.py", "_check"),  # cu_seqlens' checks
        ("packed/documents.py", "q_needed"),  # the plan's transfer flags
        ("packed/documents.py", "doc_plan"),
        ("packed/pick.py", "_split_ms"),  # the packed kernels, priced once per packing
        ("kernels/wrappers.py", "_rewrapped"),  # the per-segment record
        ("kernels/wrappers.py", "_cut"),  # the segments' cuts
        ("agree/header.py", "_docs_digest"),
    ):
        assert _calls(row, module, fn) == 0, (module, fn)
    assert not any(str(ROOT) in k for k in row["calls_per_call"])  # no machine paths
