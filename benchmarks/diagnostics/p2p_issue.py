"""Where does the host time of a lane's post go? (Under cProfile, hot_path_host.py put
~2.7 ms of ring 4's packed training call in its 12 lane posts; timed without the profiler,
`--time-posts`, a post of that call costs 82-231 us.)

Every rank posts what a ring step posts (k tensors to r+1 and k from r-1 on the Q lane, the same
the other way on the return lane), waits, and repeats; the host time of each post is timed, and
of each phase of a coalesced post on its own (start coalescing, each send, each receive, end
coalescing). Modes:
  lane     ring/comm/lanes.py's TorchLane.post (the product path; direct coalesced issue)
  phases   the same calls made here, each phase timed
  batch    torch.distributed.batch_isend_irecv
  bundle   the k tensors as one message (what bundling them would post)
  watched  lane, with the deadline's watchdog bounding each step (comm/watchdog.py), as in a call
GPU busy: a matmul queued before each step's posts (the host must not wait for it).
Environment variants (torch's flight recorder, NCCL settings) are separate launches: --label
names them in the JSON.

    torchrun --nproc-per-node 4 benchmarks/diagnostics/p2p_issue.py --label default --out p2p.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

from tokenring_xdit.ring.comm.watchdog import watch

STEPS = 60
WARMUP = 10


def _median_us(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1e6, 1)


def _phases(group, device, sends, recvs, peers, times: dict) -> list:
    t = time.perf_counter
    t0 = t()
    group._start_coalescing(device)
    t1 = t()
    for x, p in sends:
        group.send([x], peers[p], 0)
    t2 = t()
    for x, p in recvs:
        group.recv([x], peers[p], 0)
    t3 = t()
    work = group._end_coalescing(device)
    t4 = t()
    for name, dt in (("start", t1 - t0), ("sends", t2 - t1), ("recvs", t3 - t2), ("end", t4 - t3)):
        times.setdefault(name, []).append(dt)
    return [work]


def _run(mode: str, k: int, nbytes: int, busy: bool, comms, lanes, rank: int, n: int) -> dict:
    dev = torch.device("cuda")
    numel = nbytes // 2
    count = 1 if mode == "bundle" else k
    size = numel * (k if mode == "bundle" else 1)
    out = [[torch.randn(size, device=dev, dtype=torch.bfloat16) for _ in range(count)]
           for _ in "qr"]  # fmt: skip
    into = [[torch.empty_like(x) for x in xs] for xs in out]
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    post_s: list[float] = []
    phases: dict = {}
    peers = tuple(range(n))
    for i in range(WARMUP + STEPS):
        if busy:
            for _ in range(4):
                a = (a @ a).clamp_(-1, 1)  # ~0.3 ms of GPU work the posts run beside
        ends = ((0, nxt, prv), (1, prv, nxt))  # Q forward, partials back
        for lane, to, frm in ends:
            xs, ys = out[lane], into[lane]
            sends, recvs = [(x, to) for x in xs], [(y, frm) for y in ys]
            t0 = time.perf_counter()
            if mode in ("lane", "bundle", "watched"):
                lanes[lane].post(sends, recvs, "q")
            elif mode == "phases":
                lanes[lane]._works.extend((w, ("q", 0, [], [])) for w in _phases(
                    (comms.q, comms.out)[lane], dev, sends, recvs, peers,
                    phases if i >= WARMUP else {}))  # fmt: skip
            else:
                group = (comms.q, comms.out)[lane]
                ops = [dist.P2POp(dist.isend, x, p, group) for x, p in sends]
                ops += [dist.P2POp(dist.irecv, y, p, group) for y, p in recvs]
                works = dist.batch_isend_irecv(ops)
                lanes[lane]._works.extend((w, ("q", 0, [], [])) for w in works)
            if i >= WARMUP:
                post_s.append(time.perf_counter() - t0)
        for lane in lanes:
            lane.wait()
        if mode == "watched":
            watch(comms, "p2p_issue")
        if i % 8 == 7:
            torch.cuda.synchronize()
            dist.barrier(group=comms.check)
    torch.cuda.synchronize()
    row = {"mode": mode, "tensors": k, "bytes_each": nbytes, "gpu_busy": busy,
           "post_us_median": _median_us(post_s),
           "post_us_p90": round(sorted(post_s)[int(0.9 * len(post_s))] * 1e6, 1)}  # fmt: skip
    row.update({f"{p}_us": _median_us(v) for p, v in phases.items()})
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--label", default="default")
    ap.add_argument("--modes", default="lane,phases,batch,bundle")
    ap.add_argument("--tensors", default="1,2,4")
    ap.add_argument("--bytes", default="65536,8388608")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    from tokenring_xdit.ring.comm.groups import comms_of
    from tokenring_xdit.ring.comm.lanes import torch_lanes

    comms = comms_of(dist.group.WORLD)
    rows = []
    for mode in args.modes.split(","):
        for k in map(int, args.tensors.split(",")):
            if mode == "bundle" and k == 1:
                continue
            for nbytes in map(int, args.bytes.split(",")):
                for busy in (False, True):
                    lanes = torch_lanes(comms, rank)
                    rows.append(_run(mode, k, nbytes, busy, comms, lanes, rank, n))
                    if rank == 0:
                        print(json.dumps(rows[-1]), flush=True)
    if rank == 0:
        env = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_NCCL"))}
        report = {"label": args.label, "world_size": n, "torch": torch.__version__,
                  "nccl": str(torch.cuda.nccl.version()),
                  "device": torch.cuda.get_device_name(), "env": env, "rows": rows}  # fmt: skip
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
