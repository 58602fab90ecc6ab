"""Same-GPU probe of the IPC transport's driver calls, and what a copy beside attention costs.

Two processes on cuda:0 (gloo world group, CUDA IPC for data):
1. ordering: the reader's stream waits for a flag (cuStreamWaitValue32) BEFORE the writer has
   written anything; checks it stays blocked for 0.3 s, then sees the data the writer copied.
2. graphs: "wait free, copy into the peer's buffer, write ready" and "wait ready, copy out,
   write free" captured as CUDA graphs and replayed `--replays` times with changing data.
3. overlap: a cuDNN attention kernel (bf16) timed alone, then with a same-sized copy into the
   other process's IPC buffer running beside it in the other process, then with the copy on a
   side stream of the attention's own process (the situation of a real ring rank).

python benchmarks/diagnostics/ipc_overlap.py \
    --out docs/benchmarks/one-gpu-h100-2026-11-25/ipc_overlap_1xH100.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tokenring_xdit.ring.comm.ipc import driver as drv
from tokenring_xdit.tools.launch import launch


def _share(mem: drv.DeviceMemory) -> list[int]:
    """Every rank's pointer to every rank's `mem` (own pointer for itself)."""
    handles = [None] * dist.get_world_size()
    dist.all_gather_object(handles, mem.handle())
    me = dist.get_rank()
    return [mem.ptr if r == me else drv.open_peer(h, 0) for r, h in enumerate(handles)]


def _poll(event: torch.cuda.Event, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while not event.query():
        if time.monotonic() > end:
            return False
        time.sleep(1e-4)
    return True


def ordering(rank: int, nbytes: int) -> dict:
    inbox = drv.DeviceMemory.alloc(nbytes + 256, 0)
    ptrs = _share(inbox)
    flag_off = nbytes  # the flag word sits after the data
    result = {}
    if rank == 1:
        stream = torch.cuda.Stream()
        out = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        view = drv.tensor_at(inbox.ptr, nbytes, 0)
        with torch.cuda.stream(stream):
            drv.wait_value(stream, inbox.ptr + flag_off, 1)
            out.copy_(view)
            done = torch.cuda.Event()
            done.record(stream)
        time.sleep(0.3)
        result["blocked_before_write"] = not done.query()
        dist.barrier()  # now the writer writes
        result["completed_after_write"] = _poll(done, 10.0)
        result["data_ok"] = bool((out == 7).all().item())
    else:
        dist.barrier()
        src = torch.full((nbytes,), 7, dtype=torch.uint8, device="cuda")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            drv.tensor_at(ptrs[1], nbytes, 0).copy_(src)
            drv.write_value(stream, ptrs[1] + flag_off, 1)
        stream.synchronize()
    dist.barrier()
    return result


def graphs(rank: int, nbytes: int, replays: int) -> dict:
    """Rank 0 sends, rank 1 receives; flags: ready (in rank 1's page), free (in rank 0's)."""
    page = drv.DeviceMemory.alloc(256, 0)
    inbox = drv.DeviceMemory.alloc(nbytes, 0)
    pages, inboxes = _share(page), _share(inbox)
    stream = torch.cuda.Stream()
    result = {}
    if rank == 0:
        drv.write_value(torch.cuda.current_stream(), page.ptr, 1)  # free: inbox empty
        torch.cuda.synchronize()
        dist.barrier()
        src = torch.zeros(nbytes // 4, dtype=torch.int32, device="cuda")
        dst = drv.tensor_at(inboxes[1], nbytes, 0).view(torch.int32)
        g = torch.cuda.CUDAGraph()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            g.capture_begin()
            drv.wait_value(stream, page.ptr, 1)
            drv.write_value(stream, page.ptr, 0)
            dst.copy_(src)
            drv.write_value(stream, pages[1], 1)
            g.capture_end()
        torch.cuda.current_stream().wait_stream(stream)
        t0 = time.perf_counter()
        for i in range(replays):
            src.fill_(i + 1)
            g.replay()
        torch.cuda.synchronize()
        result["send_s"] = time.perf_counter() - t0
    else:
        dist.barrier()
        out = torch.zeros(nbytes // 4, dtype=torch.int32, device="cuda")
        total = torch.zeros((), dtype=torch.int64, device="cuda")
        view = drv.tensor_at(inbox.ptr, nbytes, 0).view(torch.int32)
        g = torch.cuda.CUDAGraph()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            g.capture_begin()
            drv.wait_value(stream, page.ptr, 1)
            drv.write_value(stream, page.ptr, 0)
            out.copy_(view)
            drv.write_value(stream, pages[0], 1)
            g.capture_end()
        torch.cuda.current_stream().wait_stream(stream)
        firsts = []
        for _ in range(replays):
            g.replay()
            firsts.append(out[:1].clone())
            total += out.sum(dtype=torch.int64)
        done = torch.cuda.Event()
        done.record()
        result["completed"] = _poll(done, 30.0)
        n = nbytes // 4
        want = n * replays * (replays + 1) // 2
        result["sum_ok"] = int(total.item()) == want
        result["order_ok"] = [int(x.item()) for x in firsts] == list(range(1, replays + 1))
    dist.barrier()
    return result


def _time_events(fn, reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        times.append((a, b))
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in times]


def overlap(rank: int, heads: int, seq: int, dim: int, reps: int) -> dict:
    shape = (1, heads, seq, dim)  # bhsd for SDPA
    nbytes = 2 * heads * seq * dim  # one bf16 Q block: what a ring step moves
    inbox = drv.DeviceMemory.alloc(nbytes, 0)
    ptrs = _share(inbox)
    out = {"heads": heads, "seq": seq, "dim": dim, "bytes": nbytes}
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    src = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    peer_dst = drv.tensor_at(ptrs[1 - rank], nbytes, 0).view(torch.bfloat16)
    own_dst = torch.empty_like(src)

    def attn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(q, k, v)

    for _ in range(3):
        attn()
        peer_dst.copy_(src)
    torch.cuda.synchronize()
    flops = 4 * heads * seq * seq * dim
    dist.barrier()
    # a) attention alone (rank 0), b) copy into the peer's buffer alone (rank 1)
    if rank == 0:
        t = _time_events(attn, reps)
        out["attn_alone_ms"] = statistics.median(t)
        out["attn_alone_tflops"] = flops / out["attn_alone_ms"] / 1e9
    dist.barrier()
    if rank == 1:
        t = _time_events(lambda: peer_dst.copy_(src), reps)
        out["copy_alone_ms"] = statistics.median(t)
        out["copy_alone_GBps"] = nbytes / out["copy_alone_ms"] / 1e6
    both = [None, None]
    dist.all_gather_object(both, out)
    attn_ms, copy_ms = both[0]["attn_alone_ms"], both[1]["copy_alone_ms"]
    # enough copies to cover the timed attention runs (and the start-up sleep) 1.5 times over
    copies = int(1.5 * (reps * attn_ms + 20.0) / copy_ms) + 10
    out["copies_beside"] = copies
    # c) both at once: rank 1 copies for longer than rank 0's timed attention runs
    if rank == 0:
        dist.barrier()
        time.sleep(0.02)  # let the copies start first
        t = _time_events(attn, reps)
        out["attn_with_peer_copy_ms"] = statistics.median(t)
    else:
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(copies):
                peer_dst.copy_(src)
            b.record()
        dist.barrier()
        side.synchronize()
        out["copy_beside_attn_GBps"] = nbytes * copies / a.elapsed_time(b) / 1e6
    dist.barrier()
    # d) the copy on a side stream of the attention's own process (rank 0 only)
    if rank == 0:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(copies):
                own_dst.copy_(src)
        t = _time_events(attn, reps)
        out["attn_with_own_side_copy_ms"] = statistics.median(t)
        torch.cuda.synchronize()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(copies):
                peer_dst.copy_(src)
        t = _time_events(attn, reps)
        out["attn_with_own_side_copy_to_peer_ms"] = statistics.median(t)
        torch.cuda.synchronize()
    dist.barrier()
    return out


def worker(rank: int, world: int, report, args) -> dict:
    torch.cuda.set_device(0)
    res = {"rank": rank}
    res["ordering"] = ordering(rank, 1 << 20)
    res["graphs"] = graphs(rank, 1 << 20, args.replays)
    res["overlap"] = [overlap(rank, args.heads, s, args.dim, args.reps) for s in args.seqs]
    return res


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--heads", type=int, default=24)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--seqs", type=int, nargs="+", default=[4096, 8192, 16384])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--replays", type=int, default=20)
    args = p.parse_args()
    results = launch(worker, 2, (args,), device="cpu", timeout=300)
    merged = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "args": vars(args),
        "ranks": results,
    }
    text = json.dumps(merged, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
