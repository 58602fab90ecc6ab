"""A multi-node stand-in on one host: K torchrun launchers, one per "node", each with its own
host identity for NCCL, running one benchmark across all of them.

    python -m benchmarks multi_node --nodes 2 --gpus-per-node 1 \
        --nccl-log $OUT/links.txt benchmarks/diagnostics/nccl_peers.py --out $OUT/peers.json
    python -m benchmarks multi_node --nodes 2 --socket-threads 4 --socks-per-thread 4 \
        --stamp $OUT/sweep.json ring_sweep --out $OUT/sweep.json

NCCL decides "same host" from NCCL_HOSTID (default: the host name), so launchers that each set
their own (`node0`, `node1`, ...) talk to each other through its network transport (NET/Socket
over the loopback here), while the G GPUs of one launcher keep P2P (NVLink) between them: the
layout of K real nodes of G GPUs, with a slower network. Each launcher is a plain
`torchrun --nnodes K --node-rank i --nproc-per-node G` with a c10d rendezvous on 127.0.0.1
(launcher 0 hosts the store), as on real nodes, and sees only its own G GPUs
(CUDA_VISIBLE_DEVICES). torchrun gives each node consecutive global ranks, so USP's ulysses
groups of G consecutive ranks stay inside a node and its rings cross nodes.

--socket-threads / --socks-per-thread set NCCL_SOCKET_NTHREADS / NCCL_NSOCKS_PERTHREAD (NCCL's
defaults when not given), the knob that changes the stand-in's link speed. --nccl-log writes
NCCL_DEBUG=INFO's connection lines ("... via P2P/..." / "... via NET/Socket/...") of the run to a
file, with a per-transport count: the proof of which pairs use P2P and which the network.
--stamp adds what was launched (nodes, GPUs per node, socket settings, transports seen) to the
"meta" of a JSON result the target wrote, so the planner's validation can rebuild the machine.
TARGET is a benchmark name of `python -m benchmarks` or a path to a .py script; what follows it
goes to the target. --cpu: gloo, no GPUs (the launcher's own test).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

__all__ = ["launcher_commands", "node_env", "summarize_links", "stamp", "main"]

ROOT = Path(__file__).resolve().parents[1]


def node_env(node: int, args: argparse.Namespace, base: dict[str, str]) -> dict[str, str]:
    """The environment of node `node`'s launcher (and so of its ranks)."""
    env = dict(base)
    env["NCCL_HOSTID"] = f"node{node}"
    env["STANDIN_NODE"] = str(node)  # not TOKENRING_XDIT_*: the config warns on unknown names
    if not args.cpu:
        first = node * args.gpus_per_node
        gpus = range(first, first + args.gpus_per_node)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    if args.socket_threads:
        env["NCCL_SOCKET_NTHREADS"] = str(args.socket_threads)
    if args.socks_per_thread:
        env["NCCL_NSOCKS_PERTHREAD"] = str(args.socks_per_thread)
    # no NVLink multicast anywhere (it can take a shared host's GPUs down)
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    env.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _target_argv(target: str, rest: list[str]) -> list[str]:
    if target.endswith(".py"):
        return [target, *rest]
    sys.path.insert(0, str(ROOT))
    from benchmarks import SWEEPS

    if target not in SWEEPS:
        raise SystemExit(f"unknown target {target!r}: a .py path or one of {', '.join(SWEEPS)}")
    return ["-m", "benchmarks", target, *rest]


def launcher_commands(args: argparse.Namespace) -> list[list[str]]:
    """One torchrun command line per node."""
    out = []
    for node in range(args.nodes):
        out.append([
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(args.nodes),
            "--node-rank", str(node),
            "--nproc-per-node", str(args.gpus_per_node),
            "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{args.port}",
            "--rdzv-id", f"standin-{args.port}",
            "--rdzv-conf", f"is_host={1 if node == 0 else 0}",
            "--max-restarts", "0",
            *_target_argv(args.target, args.rest),
        ])  # fmt: skip
    return out


_VIA = re.compile(r"(\d+)\[\d+\] -> (\d+)\[\d+\].* via (\S+)")


def summarize_links(lines: list[str]) -> dict:
    """NCCL's connection lines -> {transport: count} and {"src->dst": transports}."""
    transports: Counter[str] = Counter()
    pairs: dict[str, set[str]] = {}
    for line in lines:
        m = _VIA.search(line)
        if not m:
            continue
        kind = m.group(3).split("/")[0]  # P2P/CUMEM/... -> P2P, NET/Socket/0 -> NET
        transports[kind] += 1
        pairs.setdefault(f"{m.group(1)}->{m.group(2)}", set()).add(m.group(3))
    return {"transports": dict(transports), "pairs": {k: sorted(v) for k, v in pairs.items()}}


def _collect_log(log_dir: Path, dest: Path) -> dict:
    lines = []
    for f in sorted(log_dir.glob("nccl.*")):
        lines += [ln.rstrip() for ln in f.read_text(errors="replace").splitlines() if " via " in ln]
    summary = summarize_links(lines)
    with open(dest, "w") as f:
        f.write(json.dumps(summary, indent=1) + "\n")
        f.write("\n".join(lines) + "\n")
    return summary


def stamp(path: str | Path, info: dict) -> None:
    """Add `info` under meta["multi_node"] of the JSON result at `path`."""
    with open(path) as f:
        data = json.load(f)
    data.setdefault("meta", {})["multi_node"] = info
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


def _run(cmds: list[list[str]], envs: list[dict[str, str]]) -> int:
    procs = [subprocess.Popen(c, env=e, cwd=os.getcwd()) for c, e in zip(cmds, envs, strict=True)]
    rcs: list[int | None] = [None] * len(procs)
    try:
        while any(rc is None for rc in rcs):
            for i, p in enumerate(procs):
                if rcs[i] is None:
                    rcs[i] = p.poll()
            if any(rc not in (None, 0) for rc in rcs):
                break  # one node failed: the others would wait for it forever
            time.sleep(0.2)
    finally:
        for i, p in enumerate(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)  # torchrun stops its own workers
                try:
                    rcs[i] = p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    rcs[i] = p.wait()
    return next((rc for rc in rcs if rc), 0)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2, help="launchers (stand-in nodes)")
    ap.add_argument("--gpus-per-node", type=int, default=1, help="processes (GPUs) per node")
    ap.add_argument("--socket-threads", type=int, help="NCCL_SOCKET_NTHREADS (default NCCL's)")
    ap.add_argument("--socks-per-thread", type=int, help="NCCL_NSOCKS_PERTHREAD (default NCCL's)")
    ap.add_argument("--port", type=int, default=29533, help="rendezvous port on 127.0.0.1")
    ap.add_argument("--nccl-log", help="write NCCL's connection lines (P2P / NET) here")
    ap.add_argument("--stamp", help="JSON the target writes: add the launch to its meta")
    ap.add_argument("--cpu", action="store_true", help="no GPUs (gloo targets)")
    ap.add_argument("target", help="benchmark name (python -m benchmarks) or a .py path")
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="the target's arguments")
    args = ap.parse_args(argv)
    if args.nodes < 1 or args.gpus_per_node < 1:
        ap.error("--nodes and --gpus-per-node must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    base = dict(os.environ)
    # the targets import benchmarks/ and the package from the repository root
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), base.get("PYTHONPATH")) if p)
    log_dir = Path(tempfile.mkdtemp(prefix="standin-nccl-")) if args.nccl_log else None
    if log_dir is not None:
        base.update(NCCL_DEBUG="INFO", NCCL_DEBUG_FILE=str(log_dir / "nccl.%h.%p.log"))
    envs = [node_env(i, args, base) for i in range(args.nodes)]
    rc = _run(launcher_commands(args), envs)
    info = {
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "nccl_socket_nthreads": envs[0].get("NCCL_SOCKET_NTHREADS", "default"),
        "nccl_nsocks_perthread": envs[0].get("NCCL_NSOCKS_PERTHREAD", "default"),
        "nccl_hostids": [e["NCCL_HOSTID"] for e in envs],
        "command": "python -m benchmarks multi_node " + " ".join(sys.argv[1:] if argv is None
                                                                  else argv),
    }  # fmt: skip
    if log_dir is not None:
        info["links"] = _collect_log(log_dir, Path(args.nccl_log))
        shutil.rmtree(log_dir, ignore_errors=True)
        print("links:", json.dumps(info["links"]["transports"]), flush=True)
    if args.stamp and rc == 0:
        stamp(args.stamp, info)
    return rc


if __name__ == "__main__":
    sys.exit(main())
