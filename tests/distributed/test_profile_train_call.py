"""benchmarks/profile_train_call.py at a tiny size on 2 gloo ranks (its CPU wiring: the call,
the shared timeline, the rank's kernels-only ceiling, the whole-sequence ideal), with the
held-back own block off and on; the lost percents add up to what the efficiency leaves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.speed import scaled

ROOT = Path(__file__).resolve().parents[2]


def test_profile_train_call_runs_on_cpu_and_accounts_for_every_percent(tmp_path):
    out = tmp_path / "profile.json"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(ROOT / "benchmarks" / "profile_train_call.py"), "--device", "cpu",
        "--shapes", "g:4:2:16:causal,m:4:4:16:full", "--seqs", "64", "--hold-back", "0", "1",
        "--warmup", "1", "--iters", "2", "--calls", "1", "--events", "--out", str(out),
    ]  # fmt: skip
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    run = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=scaled(600)
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    # 2 shapes x hold-back off/on x 2 ranks
    assert len(rows) == 8
    assert {(r["shape"], r["hold_back"], r["rank"]) for r in rows} == {
        (s, h, r) for s in ("g", "m") for h in (False, True) for r in (0, 1)
    }
    for r in rows:
        assert r["call_ms"] > 0 and r["ceiling_ms"] > 0 and r["ideal_ms"] > 0, r
        assert set(r["timeline"]) == {
            "window_ms", "attention_ms", "nccl_in_the_open_ms",
            "merge_copy_other_in_the_open_ms", "gpu_idle_ms",
        }  # fmt: skip
        assert r["timeline"]["attention_ms"] > 0, r  # the CPU flash ops were found
        lost = sum(r["lost_percent"].values())
        assert abs(lost - 100 * (1 - r["efficiency"])) < 0.1, r
        assert r["events"], "one call's activities"
    assert "ideal 100% -> ceiling" in run.stdout
