"""Host time of the per-call work a graphed TokenRing call does besides the replay, old vs new.

    # with PYTHONPATH=<checkout>:
    python benchmarks/diagnostics/hot_path_host.py --out $OUT/hot_path_host.json
    python benchmarks/diagnostics/hot_path_host.py --path eager --ranks 4 --out eager.json
    python benchmarks/diagnostics/hot_path_host.py --path packed --ranks 4 --out packed.json
    python benchmarks/diagnostics/hot_path_host.py --path packed --ranks 4 --device cuda \
        --repeats 50 --top 40 --out packed_gpu.json

`--path eager` times whole eager inference calls instead (`token_ring_attn(cuda_graph=False)`,
non-causal, cpu_flash) at a tiny shape (1 x 4 heads x 16 tokens x 32 per rank), so the call is
its host work plus gloo's transfers; it also counts the Python function calls of one call under
cProfile (a count does not depend on the machine's load) and lists the functions with the most
own time (`--top`). Made for "the eager path must never get slower": run it with
PYTHONPATH=<old checkout> and <new checkout>, alternating.

`--path packed` times whole packed training calls: `token_ring_attn_func(q, k, v,
causal=True, cu_seqlens=cu)` forward + backward over 4 gloo ranks, the documents of
benchmarks/packed_varlen.py's default 32768-token row (seed 0, 7 documents) scaled to
--packed-tokens, zigzag shards (--layout: another of shard's), GQA 4/1 heads of 16 (tiny, so the
kernels cost little); with `--kernel segments` (default) through the per-segment wrapper that
cuDNN per segment runs on a GPU (CPU flash per segment: a diagnostic record registered here, the
same segments, loops, merges and transfers), `--kernel masked` through what auto runs on CPU.
Validation "signature" (what NCCL rings use) unless --validate says otherwise. Reports what
`--path eager` does.
`--device cuda` (4 GPUs, NCCL): the benchmark's own shape (32768 tokens, GQA 32/8 x 128, bf16)
through cuDNN per segment (`--kernel segments`) or any kernel name (`auto`); every call starts
with the GPU idle and the ranks together, so its time is the host's time to issue it; the
profile runs autograd's backward on the calling thread, so it covers both halves (the C++ time
of each op, NCCL's P2P issue and cuDNN's included, shows as that builtin's own time).

Runs 2 gloo ranks on CPU (the host side is the same whatever the device) at the smallest sweep
shape (PixArt 1024 px: 16 x 72, 4096 tokens), validate "signature" (what NCCL rings use), and
times, per call: the input check from its cache, building the call and the graph key, and the
graph-cache lookup. Works on the code before the agreed ring (`checks.check_inputs`) and after
(`checks.agree`), so one machine compares both.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

REPEATS = 5000
EAGER_REPEATS = 1000
PROFILED = 200


def _worker(rank: int, n: int, report) -> dict:
    import torch.distributed as dist

    import tokenring_xdit
    from tokenring_xdit.config import current
    from tokenring_xdit.ring import agree as checks
    from tokenring_xdit.ring.comm import RingPosition, setup_token_ring_group
    from tokenring_xdit.ring.inference.loop import RingCall
    from tokenring_xdit.ring.kernels import KERNELS
    from tokenring_xdit.ring.tensor_layout import BHSD
    from tokenring_xdit.ring.schedules import NON_CAUSAL

    setup_token_ring_group(dist.group.WORLD)
    pos = RingPosition.of(None)
    q = torch.empty(1, 16, 4096 // n, 72)
    graphs: dict = {}
    new = hasattr(checks, "agree")

    def one_call():
        cfg = current()
        scale = q.shape[-1] ** -0.5
        if new:
            spec = checks.CallSpec(
                q=q, k=q, v=q, layout=BHSD, causal=False, chunks=1, scale=scale,
                kernel=checks.digest("cudnn"), graphs=True, validate="signature",
            )  # fmt: skip
            ring = checks.agree(spec, pos)
            q_lens, agreed = ring.q_lens, ring.key
        else:
            shapes = checks.check_inputs(q, q, q, BHSD, False, 1, scale, pos, None, "signature")
            q_lens, agreed = shapes.q_lens, ()
        call = RingCall(NON_CAUSAL, KERNELS["math"], "cudnn", BHSD, scale,
                        min(1, min(q_lens)), "rear", cfg.fused_merge)  # fmt: skip
        signature = tuple((x.shape, x.stride(), x.dtype) for x in (q, q, q))
        key = (pos.group, agreed, call.graph_key(), signature)
        return graphs.setdefault(key, key)

    for _ in range(200):
        one_call()
    dist.barrier()
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        one_call()
        times.append(time.perf_counter() - t0)
    return {
        "version": "agreed ring" if new else "before the agreed ring",
        "package": str(Path(tokenring_xdit.__file__).parent),
        "median_us": statistics.median(times) * 1e6,
        "p90_us": sorted(times)[int(0.9 * len(times))] * 1e6,
    }


def _name(file: str, line: int, name: str) -> str:
    """A profiled function as package/module:line:name (no machine paths)."""
    parts = Path(file).parts
    where = (
        "/".join(parts[parts.index("tokenring_xdit") :])
        if "tokenring_xdit" in parts
        else Path(file).name
    )
    return f"{where}:{line}:{name}"


def _eager_worker(rank: int, n: int, report, top: int, repeats: int) -> dict:
    from tokenring_xdit.ring import token_ring_attn

    torch.manual_seed(rank)
    q, k, v = (torch.randn(1, 4, 16, 32) for _ in range(3))

    def one_call():
        return token_ring_attn(q, k, v, layout="bhsd", kernel="cpu_flash", cuda_graph=False)

    for _ in range(min(100, repeats)):
        one_call()
    return _timed_and_profiled(one_call, n, top, repeats, "eager call")


# benchmarks/packed_varlen.py's default row: 32768 tokens, --seed 0, --doc-lens 512,8192
PACKED_CU = (0, 7429, 11096, 17817, 25621, 29578, 30421, 32768)
SEGMENTS = "cpu_flash_segments"  # CPU flash once per segment, as cuDNN per segment on a GPU


def packed_cu(total: int) -> list[int]:
    """PACKED_CU scaled to `total` tokens (the same blocks meet the same documents)."""
    return [round(c * total / PACKED_CU[-1]) for c in PACKED_CU]


def _segments_record() -> str:
    """Register CPU flash WITHOUT its packed stand-in (`packed_as`), so a packed call runs it
    once per segment through the wrapper cuDNN per segment runs (this process only)."""
    import dataclasses

    from tokenring_xdit.ring.kernels import registry

    record = dataclasses.replace(registry.REGISTRY["cpu_flash"], name=SEGMENTS, packed_as=None)
    registry.REGISTRY[SEGMENTS] = registry.PAIRS[SEGMENTS] = record
    return SEGMENTS


def _packed_worker(
    rank: int,
    n: int,
    report,
    top: int,
    repeats: int,
    total: int,
    kernel: str,
    device: str,
    layout: str = "zigzag",
    time_posts: bool = False,
) -> dict:
    import tokenring_xdit
    from tokenring_xdit import token_ring_attn_func

    cuda = device == "cuda"
    cu = packed_cu(total)
    if kernel == "segments":  # cuDNN per segment itself on a GPU
        kernel = "cudnn" if cuda else _segments_record()
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dtype, (h, hk, d) = (torch.bfloat16, (32, 8, 128)) if cuda else (torch.float32, (4, 1, 16))
    gen = torch.Generator(device=dev).manual_seed(0)
    full = [
        torch.randn(1, total, x, d, generator=gen, device=dev).to(dtype) for x in (h, hk, hk, h)
    ]
    split = tokenring_xdit.make_split(total, n, causal=True, cu_seqlens=cu, layout=layout)
    q, k, v, do = (tokenring_xdit.shard(x, split=split) for x in full)
    q, k, v = (x.requires_grad_() for x in (q, k, v))

    def one_call():
        out = token_ring_attn_func(q, k, v, causal=True, split=split, kernel=kernel)
        out.backward(do)
        q.grad = k.grad = v.grad = None

    for _ in range(min(20, repeats)):
        one_call()
    posts = _time_posts() if time_posts else None
    sync = torch.cuda.synchronize if cuda else None
    row = _timed_and_profiled(one_call, n, top, repeats, f"packed fwd+bwd ({kernel})", sync)
    row.update(cu_seqlens=cu, heads=[h, hk, d], dtype=str(dtype), device=device, layout=layout)
    if posts is not None:
        row["posts"] = _posts_report(
            posts[: len(posts) * repeats // (repeats + 1 + min(PROFILED, repeats))]
        )
    return row


def _time_posts() -> list:
    """Time every lane post from now on (host time of TorchLane.post, whichever thread posts):
    (lane, tensors sent and received, bytes sent, seconds) each."""
    from tokenring_xdit.ring.comm import lanes

    posts: list = []
    post = lanes.TorchLane.post

    def timed(self, sends, recvs, what):
        t0 = time.perf_counter()
        works = post(self, sends, recvs, what)
        dt = time.perf_counter() - t0
        posts.append((self.name, len(sends) + len(recvs), sum(t.nbytes for t, _ in sends), dt))
        return works

    lanes.TorchLane.post = timed
    return posts


def _posts_report(posts: list) -> dict:
    """Median host time of a post by (lane, tensors, MiB sent), and the posts' total."""
    groups: dict = {}
    for lane, tensors, nbytes, dt in posts:
        groups.setdefault(f"{lane} x{tensors} {nbytes / 2**20:.0f}MiB", []).append(dt)
    return {
        "total_us": sum(p[3] for p in posts) * 1e6,
        "posts": len(posts),
        "by_kind": {
            k: {"n": len(v), "median_us": statistics.median(v) * 1e6}
            for k, v in sorted(groups.items())
        },  # fmt: skip
    }


def _timed_and_profiled(one_call, n: int, top: int, repeats: int, version: str, sync=None) -> dict:
    """Wall and thread-CPU time of `repeats` calls, then cProfile over PROFILED more. `sync`
    (CUDA): the GPU is synchronised and the ranks meet before each call, outside the clock and
    the profile, so a call's time is the host's time to issue it (nothing in it waits for the
    GPU), and the profile runs autograd's backward on this thread (it has its own per device)."""
    import contextlib
    import cProfile
    import pstats

    import torch.distributed as dist

    def settle():
        if sync is not None:
            sync()
            dist.barrier()

    dist.barrier()
    times, cpu = [], []
    for _ in range(repeats):
        settle()
        t0, c0 = time.perf_counter(), time.thread_time()
        one_call()
        cpu.append(time.thread_time() - c0)  # this thread's CPU: not the waits for the peer
        times.append(time.perf_counter() - t0)
    dist.barrier()
    profiled = min(PROFILED, repeats)
    prof = cProfile.Profile()
    one_thread = (
        torch.autograd.set_multithreading_enabled(False)
        if sync is not None
        else contextlib.nullcontext()
    )
    with one_thread:
        # a first call outside the profile: this thread's own per-thread caches (torch keeps
        # cuDNN's attention plans per thread; backward ran on autograd's thread until now) are
        # cold, and their builds (~0.1 s a shape) would be spread over the profiled calls
        settle()
        one_call()
        for _ in range(profiled):
            settle()
            prof.enable()
            one_call()
            prof.disable()
    settle()
    stats = pstats.Stats(prof)
    if os.environ.get("HOT_PATH_PSTATS"):  # a folder: each rank's profile, for pstats
        stats.dump_stats(f"{os.environ['HOT_PATH_PSTATS']}/rank{dist.get_rank()}.pstats")
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])
    comm = sum(c[2] for (_, _, name), c in rows if "_distributed_c10d" in name)
    return {
        "version": version,
        "ranks": n,
        "median_us": statistics.median(times) * 1e6,
        "p90_us": sorted(times)[int(0.9 * len(times))] * 1e6,
        "cpu_us": statistics.median(cpu) * 1e6,
        "python_calls_per_call": stats.total_calls / profiled,
        # under the profiler (slower than without it), less the time inside c10d's calls
        "profiled_us_less_comm": (stats.total_tt - comm) / profiled * 1e6,
        "calls_per_call": {
            _name(f, line, name): c[1] / profiled
            for (f, line, name), c in sorted(stats.stats.items())
        },
        "top_own_time": [
            {
                "function": _name(f, line, name),
                "calls_per_call": c[1] / profiled,
                "own_us_per_call": c[2] / profiled * 1e6,
            }  # fmt: skip
            for (f, line, name), c in rows[:top]
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="hot_path_host.json")
    parser.add_argument("--path", choices=("graphed", "eager", "packed"), default="graphed")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--top", type=int, default=25, help="eager: functions listed")
    parser.add_argument("--label", default="", help="eager: which code (recorded as given)")
    parser.add_argument("--repeats", type=int, default=EAGER_REPEATS, help="eager: timed calls")
    parser.add_argument(
        "--packed-tokens", type=int, default=0, help="packed: the row (0: 256 on cpu, 32768 cuda)"
    )
    parser.add_argument(
        "--kernel", default="segments",
        help="packed: segments (cuDNN per segment; on cpu CPU flash per segment), or a kernel name",
    )  # fmt: skip
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="packed")
    parser.add_argument("--validate", default="signature", help="packed: the check mode")
    parser.add_argument(
        "--time-posts", action="store_true", help="packed: time each lane post (host time)"
    )
    parser.add_argument(
        "--layout", default="zigzag", help="packed: the row's layout (shard's: zigzag, "
        "contiguous, documents, auto)",
    )  # fmt: skip
    args = parser.parse_args()
    from tokenring_xdit.tools.launch import launch

    env = {"OMP_NUM_THREADS": "1"}
    if args.path == "eager":
        row = launch(_eager_worker, args.ranks, (args.top, args.repeats), env=env, timeout=600)[0]
        repeats = args.repeats
        row["label"] = args.label
    elif args.path == "packed":
        env["TOKENRING_XDIT_VALIDATE"] = args.validate
        tokens = args.packed_tokens or (32768 if args.device == "cuda" else 256)
        work = (args.top, args.repeats, tokens, args.kernel, args.device, args.layout,
                args.time_posts)  # fmt: skip
        row = launch(_packed_worker, args.ranks, work, device=args.device, env=env, timeout=600)[0]
        repeats = args.repeats
        row.update(label=args.label, validate=args.validate)
    else:
        row = launch(_worker, args.ranks, env=env, timeout=300)[0]
        repeats = REPEATS
    row.update(machine=platform.node(), cpu_count=__import__("os").cpu_count(),
               torch=torch.__version__, repeats=repeats,
               load_avg=__import__("os").getloadavg())  # fmt: skip
    print(json.dumps(row, indent=1))
    Path(args.out).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
