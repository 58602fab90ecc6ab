"""Forward + backward time per attention call: TokenRing vs yunchang's rings vs torch's templated
ring vs ulysses, causal and non-causal, on any number of GPUs (also the GPU check script).

    torchrun --nproc-per-node 8 benchmarks/train_sweep.py --out train_sweep.json
    torchrun --nproc-per-node 1 benchmarks/train_sweep.py --check     # ring degree 1 + checks
    torchrun --nproc-per-node 4 benchmarks/train_sweep.py --ulysses 2 --check  # ulysses 2 x ring 2

Shapes are Llama-style (head size 128; 32 heads = Llama-2/3 7-8B, 64 = 70B without GQA).
Every rank holds the zigzag shard (chunks r and 2N-1-r) for causal calls and a contiguous shard
otherwise. Warm-up excluded, CUDA events, median of --iters. With --check every TokenRing
configuration is first compared (out and dq/dk/dv) with exact attention of the whole sequence
(the worst rank's error is recorded).
Results: JSON (machine, versions, per-config ms); a --nproc-per-node 1 run gives the single-GPU
time that the fraction of ideal (t_1 / (N t_N)) is computed from. On CUDA each shape's one-GPU
time is also taken in the same run (`--one-gpu`, on by default: the training kernel pair, cuDNN
on H100/H200, forward + backward of the whole sequence on each GPU): rows get `one_gpu_ms` and
`efficiency` (one-GPU / N over the method's time), and with `--ceiling` (on by default)
TokenRing's rows get the ring's kernel ceiling (benchmarks/ceiling.py, fwd+bwd) and
`of_ceiling`, its efficiency over that ceiling.

Baselines: yunchang's basic and zigzag rings (zigzag is causal-only: its non-causal rows run the
basic ring) with flash-attn, or without it TokenRing's cuDNN pair behind yunchang's FA kernel
functions (`yunchang_kernel` in the JSON says which); torch's templated ring with its flash and
its cuDNN ops (head-tail load balancing for causal calls only, as torch requires); ulysses
(yunchang's LongContextAttention, FA kernels as above).

--ulysses U (U > 1; it must divide N and the heads): every ring method runs as USP (yunchang's
hybrid sequence parallelism) does it: an all-to-all over U consecutive ranks (heads -> sequence),
the ring over the N/U ranks of stride U, the all-to-all back. TokenRing and yunchang's rings are
yunchang's own LongContextAttention (ring_impl_type "token_ring", "basic", "zigzag"; AttnType.FA)
after `set_seq_parallel_pg(U, N/U)`; torch's templated ring, which yunchang has no ring_impl_type
for, runs on the ring dimension of a (N/U, U) device mesh between yunchang's autograd all-to-alls
(SeqAllToAll4D, the ones LongContextAttention uses), so every method pays the same all-to-alls.
`ulysses` stays the pure ulysses-N baseline. Causal shards are yunchang's hybrid zigzag split
(EXTRACT_FUNC_DICT["zigzag"]: ring rank r = rank // U holds chunks r and 2R-1-r of 2R, R = N/U, and
ulysses rank rank % U its U-th part of them) for TokenRing, yunchang's zigzag ring and torch's
head-tail ring; every other method holds contiguous shards. --check then compares every method,
each on its own shards. With U = 1 nothing changes: the rings span all ranks and --check covers
TokenRing.

--device cpu (gloo): a correctness run of the same wiring without a GPU, small --seqs and
--check-tokens only (timing is wall clock there and means little). The block kernels are torch's
CPU flash pair (TokenRing's "cpu_flash"; behind yunchang.kernels' FA functions for its rings, as
the cuDNN pair is on a GPU without flash-attn); torch's templated ring is left out (its ring ops
call CUDA-only SDPA kernels), and so is `ulysses` (yunchang's ring at degree 1 still sends dk/dv
to itself in its backward, which gloo refuses; NCCL allows it). yunchang's rings are checked in
bf16 only: with fp32 inputs their basic ring's dq aliases its block buffer (dq 2x the last block).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import time

import torch
import torch.distributed as dist

SHAPES = {"llama-8b-heads": (32, 128), "llama-70b-heads": (64, 128)}


def _zigzag(x, rank, n, dim=1):
    chunks = x.chunk(2 * n, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * n - 1 - rank]], dim=dim).contiguous()


def _contiguous(x, rank, n, dim=1):
    return x.chunk(n, dim=dim)[rank].contiguous()


def _impls(n: int, u: int = 1, device: str = "cuda"):
    """name -> fn(q, k, v, causal) with q/k/v (b, s_local, h, d), differentiable; with u > 1 the
    ring methods run as USP (ulysses u x ring n/u), `ulysses` over all n ranks either way."""
    _yunchang_kernel(device)
    if u > 1:
        return _usp_impls(n, u, device)
    from yunchang import ring_flash_attn_func, zigzag_ring_flash_attn_func

    from tokenring_xdit.ring import token_ring_attn_func
    from tokenring_xdit.ring.split.sharding import make_split

    def zigzag(q):  # this script cuts zigzag shards itself: the split they were cut by
        return make_split(q.shape[1] * n, n, causal=True)

    def token_ring(q, k, v, c):
        return token_ring_attn_func(q, k, v, causal=c, split=zigzag(q) if c else None)

    impls = {"token_ring": token_ring}
    from tokenring_xdit.config import current

    if hasattr(current(), "train_hold_back"):  # (an older package, run as a baseline, has not)
        held = current().replace(train_hold_back=True)

        def token_ring_hold_back(q, k, v, c):  # the own block held back in part (hold_back.py)
            split = zigzag(q) if c else None
            return token_ring_attn_func(q, k, v, causal=c, config=held, split=split)

        impls["token_ring_hold_back"] = token_ring_hold_back

    def yunchang_zigzag(q, k, v, c):
        if not c:  # yunchang's zigzag ring is causal-only: its non-causal ring is the basic one
            return ring_flash_attn_func(q, k, v, causal=c)
        return zigzag_ring_flash_attn_func(q, k, v, causal=c)

    impls["yunchang_zigzag"] = yunchang_zigzag
    impls["yunchang_basic"] = lambda q, k, v, c: ring_flash_attn_func(q, k, v, causal=c)
    if device == "cuda":  # torch's ring ops call CUDA-only SDPA kernels
        impls["torch_templated_ring"] = _torch_ring(n, "flash")
        impls["torch_templated_ring_cudnn"] = _torch_ring(n, "cudnn")
    if device == "cuda":  # on gloo its ring-1 backward fails (see --device cpu above)
        impls["ulysses"] = _ulysses(n)
    return impls


def _usp_impls(n: int, u: int, device: str):
    """The methods of _impls as USP does them: yunchang's LongContextAttention over
    set_seq_parallel_pg(u, n / u) groups (torch's ring between its all-to-alls), ulysses-n."""
    from yunchang import LongContextAttention, set_seq_parallel_pg
    from yunchang.globals import PROCESS_GROUP
    from yunchang.kernels import AttnType

    # yunchang's groups are process-wide and each layer keeps those current when it is built:
    # the ulysses-n layer first, then the hybrid groups for every other one
    ulysses = _ulysses(n) if device == "cuda" else None
    set_seq_parallel_pg(u, n // u, dist.get_rank(), n)

    def layer(ring_impl_type):
        # AttnType.FA: the ring kernel with a backward (flash-attn, or the pair _yunchang_kernel
        # put behind it); TokenRing maps FA without flash-attn to its best pair with an lse
        return LongContextAttention(ring_impl_type=ring_impl_type, attn_type=AttnType.FA)

    token_ring_layer, basic, zigzag = layer("token_ring"), layer("basic"), layer("zigzag")

    def token_ring(q, k, v, c):  # yunchang's ring function passes its zigzag split itself
        return token_ring_layer(q, k, v, causal=c)

    impls = {
        "token_ring": token_ring,
        # causal-only, as at u = 1: non-causal rows run the basic ring
        "yunchang_zigzag": lambda q, k, v, c: (zigzag if c else basic)(q, k, v, causal=c),
        "yunchang_basic": lambda q, k, v, c: basic(q, k, v, causal=c),
    }
    if device == "cuda":
        mesh = _ring_mesh(n, u, device)
        for name, kind in (
            ("torch_templated_ring", "flash"),
            ("torch_templated_ring_cudnn", "cudnn"),
        ):
            ring = _torch_ring(n // u, kind, mesh)
            impls[name] = _behind_all_to_all(ring, PROCESS_GROUP.ULYSSES_PG)
    if ulysses is not None:
        impls["ulysses"] = ulysses
    return impls


def _ring_mesh(n: int, u: int, device: str):
    """The 1-D device mesh of this rank's ring: ranks laid out (n/u, u), its "ring" dimension
    is {r % u, r % u + u, ...}, yunchang's ring group (use_ulysses_low) in the same order."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device, (n // u, u), mesh_dim_names=("ring", "ulysses"))["ring"]


def _behind_all_to_all(fn, ulysses_pg):
    """fn between LongContextAttention's autograd all-to-alls over `ulysses_pg`: (b, s/u, h, d)
    -> (b, s, h/u, d) in, the inverse out."""
    from yunchang.comm.all_to_all import SeqAllToAll4D

    def run(q, k, v, causal):
        qs, ks, vs = (SeqAllToAll4D.apply(ulysses_pg, x, 2, 1, False) for x in (q, k, v))
        return SeqAllToAll4D.apply(ulysses_pg, fn(qs, ks, vs, causal), 1, 2, False)

    return run


def _shard_for(name: str, causal: bool, rank: int, n: int, u: int):
    """x (b, s, ...) -> this rank's shard for method `name`: zigzag for the causal calls of the
    zigzag-aware rings (yunchang's hybrid split for u > 1), contiguous otherwise."""
    zigzag = causal and name in ZIGZAG_METHODS
    if u == 1:
        return lambda x: (_zigzag if zigzag else _contiguous)(x, rank, n)
    from yunchang.comm.extract_local import EXTRACT_FUNC_DICT

    extract = EXTRACT_FUNC_DICT["zigzag" if zigzag else "basic"]
    return lambda x: extract(x, rank, world_size=n, rd=n // u, ud=u).contiguous()


# methods whose causal calls take zigzag shards (torch's with head-tail load balancing)
ZIGZAG_METHODS = ("token_ring", "token_ring_hold_back", "yunchang_zigzag",
                  "torch_templated_ring", "torch_templated_ring_cudnn")  # fmt: skip
OPT_IN = "token_ring_hold_back"  # runs only when --methods names it


YUNCHANG_KERNEL = "flash_attn"


def _yunchang_kernel(device: str = "cuda") -> None:
    """yunchang's rings take their block kernels from yunchang.kernels (flash-attn for AttnType.FA,
    the only type with a backward there). Without flash-attn they get TokenRing's cuDNN pair
    (on CPU: its CPU flash pair) behind the same two functions, so their schedule and
    communication can still be measured (the pair's output is written into yunchang's buffers:
    one copy per block more than FA)."""
    global YUNCHANG_KERNEL
    if device == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return
    import yunchang.kernels as yk

    from tokenring_xdit.ring.kernels import PAIRS
    from tokenring_xdit.ring.tensor_layout import BSHD

    pair = PAIRS["cudnn" if device == "cuda" else "cpu_flash"]
    YUNCHANG_KERNEL = (
        f"{pair.name} (TokenRing's pair in yunchang.kernels.flash_attn_forward/_backward)"
    )

    def forward(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, *args, **kwargs):
        scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
        return pair.forward(q, k, v, scale, BSHD, causal)

    def backward(dout, q, k, v, out, lse, dq, dk, dv, dropout_p, softmax_scale, causal, *rest,
                 **kwargs):  # fmt: skip
        scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
        grads = pair.backward(dout, q, k, v, out, lse, None, scale, BSHD, causal)
        for buf, g in zip((dq, dk, dv), grads, strict=True):
            buf.copy_(g)

    yk.flash_attn_forward, yk.flash_attn_backward = forward, backward


def _torch_ring(n, kind, mesh=None):
    """torch's templated ring over `mesh` (1-D, n ranks; default: all ranks)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp

    mesh = mesh if mesh is not None else init_device_mesh("cuda", (n,))
    fwd = getattr(cp, f"_scaled_dot_product_ring_{kind}_attention")
    bwd = getattr(cp, f"_scaled_dot_product_ring_{kind}_attention_backward")

    class Ring(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal):
            res = fwd(mesh, q, k, v, is_causal=causal)
            ctx.save_for_backward(q, k, v, res[0], res[1])
            ctx.rest, ctx.causal = res[2:], causal
            return res[0]

        @staticmethod
        def backward(ctx, dout):
            q, k, v, out, lse = ctx.saved_tensors
            cum_q, cum_k, max_q, max_k, seed, offset = ctx.rest[:6]
            if kind == "flash":
                grads = bwd(
                    mesh, dout, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, ctx.causal,
                    seed, offset, scale=None,
                )  # fmt: skip
            else:
                grads = bwd(
                    mesh, dout, q, k, v, out, lse, seed, offset, None, cum_q, cum_k, max_q,
                    max_k, 0.0, ctx.causal, scale=None,
                )  # fmt: skip
            return (*grads[:3], None)

    def run(q, k, v, causal):  # torch's op is (b, h, s, d)
        # head-tail load balancing = our zigzag shards, causal only; non-causal shards are
        # contiguous and torch refuses load balancing for them
        cp._cp_options.enable_load_balance = causal
        out = Ring.apply(*(x.transpose(1, 2) for x in (q, k, v)), causal)
        return out.transpose(1, 2)

    return run


def _ulysses(n):
    from yunchang import LongContextAttention, set_seq_parallel_pg
    from yunchang.kernels import AttnType

    set_seq_parallel_pg(n, 1, dist.get_rank(), n)
    # AttnType.FA: the ring kernel with a backward (flash-attn, or the cuDNN pair above)
    layer = LongContextAttention(ring_impl_type="basic", attn_type=AttnType.FA)
    return lambda q, k, v, c: layer(q, k, v, causal=c)


def _time(fn, q, k, v, do, causal, warmup, iters) -> float:
    for _ in range(warmup):
        fn(q, k, v, causal).backward(do)
    times = []
    for _ in range(iters):
        if not q.is_cuda:  # --device cpu: wall clock
            dist.barrier()
            start_s = time.perf_counter()
            fn(q, k, v, causal).backward(do)
            times.append((time.perf_counter() - start_s) * 1e3)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        start.record()
        fn(q, k, v, causal).backward(do)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _reference(b, s, h, d, causal, device="cuda", dtype=torch.bfloat16):
    """A (b, s, h, d) problem for --check: inputs (q, k, v, do) in `dtype` and the exact fp64
    (out, dq, dk, dv) of the whole sequence, a few heads at a time (heads are independent; it
    bounds the fp64 score matrices at 4 ranks x 1024 tokens to about 2 GB)."""
    gen = torch.Generator(device=device).manual_seed(0)
    inputs = [torch.randn(b, s, h, d, device=device, generator=gen).to(dtype) for _ in range(4)]
    parts = []
    for heads in torch.arange(h).split(8):
        sl = slice(int(heads[0]), int(heads[-1]) + 1)
        xs = [x[:, :, sl].double().requires_grad_() for x in inputs[:3]]
        out = torch.nn.functional.scaled_dot_product_attention(
            *(x.transpose(1, 2) for x in xs), is_causal=causal
        ).transpose(1, 2)
        out.backward(inputs[3][:, :, sl].double())
        parts.append((out.detach(), *(x.grad for x in xs)))
    return inputs, [torch.cat(p, dim=2) for p in zip(*parts, strict=True)]


def _check(fn, shard, problem, causal) -> dict:
    """fn's out (max abs error) and dq/dk/dv (max abs error / max |exact|) on each rank's
    `shard` of `problem` (_reference's), against the exact values; the maximum over ranks."""
    (q, k, v, do), (ref, *ref_grads) = problem
    loc = [shard(x).requires_grad_() for x in (q, k, v)]
    out = fn(*loc, causal)
    out.backward(shard(do))
    errs = {"out": (out.double() - shard(ref)).abs().max().item()}
    for name, x, r in zip(("dq", "dk", "dv"), loc, ref_grads, strict=True):
        ref_g = shard(r)
        errs[name] = ((x.grad.double() - ref_g).abs().max() / ref_g.abs().max()).item()
    worst = torch.tensor(list(errs.values()), dtype=torch.float64, device=q.device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # rank 0 writes the JSON: every rank's worst
    return dict(zip(errs, worst.tolist(), strict=True))


def _reference_times(args, seq, h, d, causal, n, u, with_ceiling) -> dict:
    """One-GPU time of the whole sequence (the training kernel pair TokenRing resolves, cuDNN on
    H100/H200, forward + backward; every rank on its own GPU at once, no transfers) and,
    with_ceiling, the ring part's kernel ceiling (benchmarks/ceiling.py)."""
    from ceiling import ceiling  # benchmarks/ceiling.py (this folder is on sys.path)

    common = dict(batch=args.batch, causal=causal, train=True, iters=args.iters,
                  budget_ms=2000.0)  # fmt: skip
    whole = ceiling(seq, h, d, 1, **common)["whole_ms"]
    out = {"one_gpu_ms": whole}
    if with_ceiling and n // u > 1:
        ring_whole = whole if u == 1 else None  # the ring part has h / u heads under USP
        try:
            c = ceiling(seq, h // u, d, n // u, whole_ms=ring_whole, **common)
            out["ceiling"] = c["ceiling"]
        except (ValueError, RuntimeError) as exc:  # record, keep sweeping
            out["ceiling_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    torch.cuda.empty_cache()
    return out


def _add_efficiency(row: dict, name: str, extra: dict, n: int) -> None:
    if "one_gpu_ms" not in extra or not row.get("ms"):
        return
    row["one_gpu_ms"] = extra["one_gpu_ms"]
    row["efficiency"] = extra["one_gpu_ms"] / n / row["ms"]
    if name == "token_ring" and extra.get("ceiling"):
        row["ceiling"] = extra["ceiling"]
        row["of_ceiling"] = row["efficiency"] / extra["ceiling"]
    if name == "token_ring" and extra.get("ceiling_error"):
        row["ceiling_error"] = extra["ceiling_error"]


def _efficiency_line(rows: list[dict]) -> str:
    """One shape's methods: efficiency (one GPU / N over time) and TokenRing's share of its
    kernel ceiling."""
    r0 = rows[0]
    mask = "causal" if r0["causal"] else "full"
    effs = ", ".join(f"{r['impl']} {r['efficiency']:.3f}" for r in rows if "efficiency" in r)
    text = f"  {r0['shape']} {r0['seq']} {mask}: efficiency {effs}"
    tr = next((r for r in rows if r["impl"] == "token_ring" and "of_ceiling" in r), None)
    if tr is not None:
        text += f"; TokenRing at {tr['of_ceiling']:.3f} of its kernel ceiling {tr['ceiling']:.3f}"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", default="8192,32768", help="global sequence lengths")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--check-tokens", type=int, default=1024, help="--check tokens per rank")
    parser.add_argument("--ulysses", type=int, default=1, help="ulysses degree U (ring = N / U)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", default="train_sweep.json")
    on = dict(action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--one-gpu", help="time the whole sequence on one GPU (CUDA)", **on)
    parser.add_argument("--ceiling", help="time TokenRing's kernel ceiling (CUDA)", **on)
    parser.add_argument(
        "--methods", default="", help="comma-separated methods to run (default: all but "
        "token_ring_hold_back, which runs only when named)",
    )  # fmt: skip
    args = parser.parse_args()
    cuda = args.device == "cuda"
    one_gpu = cuda if args.one_gpu is None else args.one_gpu and cuda
    with_ceiling = one_gpu if args.ceiling is None else args.ceiling and cuda

    import tokenring_xdit
    from tokenring_xdit.ring.comm import setup_token_ring_group

    tokenring_xdit.install()
    device, u = args.device, args.ulysses
    world = int(os.environ.get("WORLD_SIZE", 1))  # same answer on every rank, before any group
    if u < 1 or world % u or any(h % u for h, _ in SHAPES.values()):
        raise SystemExit(f"--ulysses {u} must divide the {world} ranks and the heads of {SHAPES}")
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    setup_token_ring_group(dist.group.WORLD)
    impls = _impls(n, u, device)
    wanted = args.methods.split(",") if args.methods else [m for m in impls if m != OPT_IN]
    unknown = set(wanted) - set(impls)
    if unknown:
        raise SystemExit(f"unknown methods {sorted(unknown)}; use {', '.join(impls)}")
    impls = {name: fn for name, fn in impls.items() if name in wanted}
    # u = 1: TokenRing is checked, as before; u > 1: every method, each on its own shards
    checked = list(impls) if u > 1 else [m for m in ("token_ring", OPT_IN) if m in impls]
    rows, checks = [], {}
    for shape, (h, d) in SHAPES.items():
        for causal in (True, False):
            key = f"{shape}/{'causal' if causal else 'full'}"
            if args.check:
                problem = _reference(2, args.check_tokens * n, h, d, causal, device)
                for name in checked:
                    shard = _shard_for(name, causal, rank, n, u)
                    try:
                        errs = _check(impls[name], shard, problem, causal)
                    except Exception as e:  # a baseline that cannot run it; TokenRing must
                        if name == "token_ring":
                            raise
                        errs = dict(error=f"{type(e).__name__}: {str(e)[:200]}")
                    checks[key if u == 1 and name == "token_ring" else f"{key}/{name}"] = errs
            for seq in map(int, args.seqs.split(",")):
                s_local = seq // n
                gen = torch.Generator(device=device).manual_seed(rank)
                extra = {}
                if one_gpu:
                    extra = _reference_times(args, seq, h, d, causal, n, u, with_ceiling)
                q, k, v, do = (
                    torch.randn(args.batch, s_local, h, d, device=device, generator=gen)
                    .bfloat16()
                    .requires_grad_(i < 3)
                    for i in range(4)
                )
                for name, fn in impls.items():
                    try:
                        ms = _time(fn, q, k, v, do, causal, args.warmup, args.iters)
                        row = dict(impl=name, ms=ms)
                    except Exception as e:  # a baseline that cannot run this config
                        row = dict(impl=name, error=f"{type(e).__name__}: {str(e)[:200]}")
                    _add_efficiency(row, name, extra, n)
                    rows.append(dict(shape=shape, heads=h, head_dim=d, seq=seq, causal=causal,
                                     world=n, ulysses=u, ring=n // u, **row))  # fmt: skip
                    if rank == 0:
                        print(rows[-1], flush=True)
                if rank == 0 and extra:
                    print(_efficiency_line(rows[-len(impls) :]), flush=True)
    if rank == 0:
        result = dict(
            machine=platform.node(),
            gpu=torch.cuda.get_device_name() if device == "cuda" else "cpu",
            torch=torch.__version__,
            world=n,
            ulysses=u,
            ring=n // u,
            yunchang_kernel=YUNCHANG_KERNEL,
            checks=checks,
            rows=rows,
        )
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print("checks:", json.dumps(checks, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
