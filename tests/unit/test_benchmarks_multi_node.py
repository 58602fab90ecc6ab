"""benchmarks/multi_node.py: K torchrun launchers with their own NCCL_HOSTID on one host, run
end to end on CPU (gloo, 2 "nodes" x 1 process) with the training adapter's real methods."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import multi_node  # noqa: E402
from tests.speed import scaled  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(*argv: str, timeout: int = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "benchmarks", "multi_node", "--port", str(_free_port()), *argv]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=scaled(timeout))


def test_two_cpu_nodes_train_gqa_and_mha_exactly(tmp_path):
    out = tmp_path / "train.json"
    run = _launch(
        "--cpu", "--nodes", "2", "--stamp", str(out),
        "multi_node_train", "--device", "cpu", "--shapes", "g:4:2:16:causal,m:4:4:16:full",
        "--seqs", "128", "--check", "--check-tokens", "32", "--iters", "1", "--warmup", "0",
        "--methods", "token_ring,ulysses,yunchang_basic,yunchang_zigzag", "--out", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(out.read_text())
    # each rank ran under its own launcher's host identity, in node order
    assert data["meta"]["node_of_rank"] == ["node0", "node1"]
    launch = data["meta"]["multi_node"]
    assert launch["nodes"] == 2 and launch["gpus_per_node"] == 1
    assert launch["nccl_hostids"] == ["node0", "node1"]
    expected = {f"g/{m}" for m in ("token_ring", "ulysses", "yunchang_basic", "yunchang_zigzag")}
    expected |= {"m/token_ring", "m/ulysses", "m/yunchang_basic"}  # zigzag: causal rows only
    assert set(data["checks"]) == expected
    for key, errs in data["checks"].items():
        assert "error" not in errs, (key, errs)
        assert max(errs.values()) < 0.03, (key, errs)  # bf16 against exact fp64
    assert len(data["rows"]) == 7 and all(r["ms"] > 0 for r in data["rows"])


def test_a_failing_node_fails_the_launch(tmp_path):
    run = _launch(
        "--cpu", "--nodes", "2", "multi_node_train", "--device", "cpu", "--methods", "nope",
        "--out", str(tmp_path / "x.json"), timeout=300,
    )  # fmt: skip
    assert run.returncode != 0
    assert "unknown methods" in run.stderr + run.stdout


def test_each_node_gets_its_gpus_host_identity_and_socket_settings():
    args = multi_node.parse_args(
        ["--nodes", "2", "--gpus-per-node", "2", "--socket-threads", "4",
         "--socks-per-thread", "8", "ring_sweep", "--out", "x.json"]
    )  # fmt: skip
    envs = [multi_node.node_env(i, args, {}) for i in range(2)]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1", "2,3"]
    assert [e["NCCL_HOSTID"] for e in envs] == ["node0", "node1"]
    assert all(e["NCCL_SOCKET_NTHREADS"] == "4" and e["NCCL_NSOCKS_PERTHREAD"] == "8" for e in envs)
    assert all(e["NCCL_NVLS_ENABLE"] == "0" for e in envs)
    cmds = multi_node.launcher_commands(args)
    assert [c[c.index("--node-rank") + 1] for c in cmds] == ["0", "1"]
    assert all(c[c.index("--nnodes") + 1] == "2" for c in cmds)
    assert cmds[0][-4:] == ["benchmarks", "ring_sweep", "--out", "x.json"]
    assert "is_host=1" in cmds[0] and "is_host=0" in cmds[1]


def test_nccl_connection_lines_are_classified_per_pair():
    lines = [
        "vm:768:768 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0",
        "vm:768:768 [0] NCCL INFO Channel 01/1 : 1[1] -> 0[0] [receive] via NET/Socket/0/Shared",
        "vm:770:770 [1] NCCL INFO Channel 00/0 : 2[2] -> 3[3] via P2P/CUMEM",
        "vm:770:770 [1] NCCL INFO Connected all rings",
    ]
    s = multi_node.summarize_links(lines)
    assert s["transports"] == {"NET": 2, "P2P": 1}
    assert s["pairs"] == {
        "0->1": ["NET/Socket/0"],
        "1->0": ["NET/Socket/0/Shared"],
        "2->3": ["P2P/CUMEM"],
    }
