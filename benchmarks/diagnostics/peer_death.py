"""A peer that dies in the middle of a TokenRing loop: what the survivor sees (issue 44).

Two plain processes (no launcher that would kill the survivor), one GPU each (NCCL), or CPU
(gloo). Rank 1 leaves with `os._exit(1)` right after posting call `--die-at`; rank 0 keeps
calling. Printed and written as JSON: the survivor's first exception (type, message, seconds
after the peer died), its exit code (3 when it caught TokenRingCommError and exited on purpose;
-6 is SIGABRT: torch's watchdog took it down) and the tail of its stderr.

    python benchmarks/diagnostics/peer_death.py --mode train --timeout 8 --out peer_death.json
    python benchmarks/diagnostics/peer_death.py --mode infer --graphs 1
    python benchmarks/diagnostics/peer_death.py --device cpu --tokens 256

tests/gpu/test_gpu_peer_death.py asserts on its results.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.harness import plain_ranks  # noqa: E402

PROGRAM = r"""
import json, os, sys, time, torch, torch.distributed as dist
MODE, DIE_AT, TOKENS, CALLS, DEVICE = {mode!r}, {die_at}, {tokens}, {calls}, {device!r}
dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo")
rank = dist.get_rank()
device = torch.device("cuda", rank) if DEVICE == "cuda" else torch.device("cpu")
if DEVICE == "cuda":
    torch.cuda.set_device(device)
dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
import tokenring_xdit as tr
from tokenring_xdit.ring.comm import TokenRingCommError
torch.manual_seed(0)
def say(**what):
    print("EVENT " + json.dumps(dict(what, rank=rank, t=time.time())), flush=True)
x = torch.randn(1, TOKENS, 32, 128, device=device, dtype=dtype)
kv = torch.randn(1, TOKENS, 8, 128, device=device, dtype=dtype)
q = tr.shard(x, None, causal=True).requires_grad_(MODE == "train")
k = tr.shard(kv, None, causal=True).requires_grad_(MODE == "train")
v = tr.shard(kv, None, causal=True).requires_grad_(MODE == "train")
try:
    for i in range(CALLS):
        if MODE == "train":
            out = tr.token_ring_attn_func(q, k, v, causal=True)
            out.float().square().mean().backward()
        else:
            with torch.no_grad():
                out = tr.token_ring_attn(q, k, v)[0]
        if rank == 1 and i == DIE_AT:
            say(event="died", call=i)
            os._exit(1)
        if i % 10 == 9:
            loss = out.float().mean().item()  # where a training loop blocks on the GPU
    say(event="finished")
except TokenRingCommError as exc:
    say(event="error", type=type(exc).__name__, message=str(exc)[:600], call=i)
    sys.exit(3)
except BaseException as exc:
    say(event="error", type=type(exc).__name__, message=str(exc)[:600], call=i)
    raise
"""


def run(
    mode: str = "train",
    die_at: int = 30,
    tokens: int = 16384,
    calls: int = 400,
    device: str = "cuda",
    timeout: float = 8.0,
    graphs: int = 1,
    wall: float = 150.0,
    env: dict[str, str] | None = None,
) -> dict:
    """Run the scenario once; the survivor's outcome as a dict."""
    program = PROGRAM.format(mode=mode, die_at=die_at, tokens=tokens, calls=calls, device=device)
    procs = plain_ranks(
        program,
        2,
        {"TOKENRING_XDIT_TIMEOUT": str(timeout), "TOKENRING_XDIT_CUDA_GRAPHS": str(graphs)}
        | (env or {}),
    )
    start = time.time()
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(wall - (time.time() - start), 1))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        outs.append((p.returncode, out, err))
    events = [
        json.loads(line[6:])
        for _, out, _ in outs
        for line in out.splitlines()
        if line.startswith("EVENT ")
    ]
    died = next((e["t"] for e in events if e["event"] == "died"), None)
    first = next((e for e in events if e["rank"] == 0 and e["event"] == "error"), None)
    code, _, err = outs[0]
    return dict(
        mode=mode,
        device=device,
        tokens=tokens,
        timeout_s=timeout,
        graphs=graphs,
        env=env or {},
        survivor_exit_code=code,
        survivor_error=first and {k: first[k] for k in ("type", "message", "call")},
        error_after_death_s=None if first is None or died is None else first["t"] - died,
        survivor_finished=any(e["rank"] == 0 and e["event"] == "finished" for e in events),
        sigabrt="terminate called" in err or code == -6,
        wall_s=time.time() - start,
        stderr_tail=err[-1500:],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=("train", "infer"), default="train")
    parser.add_argument("--die-at", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--timeout", type=float, default=8.0, help="TOKENRING_XDIT_TIMEOUT")
    parser.add_argument("--graphs", type=int, default=1, help="TOKENRING_XDIT_CUDA_GRAPHS")
    parser.add_argument("--wall", type=float, default=150.0, help="kill both after this")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = run(
        args.mode, args.die_at, args.tokens, args.calls, args.device, args.timeout,
        args.graphs, args.wall,
    )  # fmt: skip
    result["machine"] = platform.node()
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
