"""Ring degree 1 forward + backward: TokenRing's training path vs SDPA cuDNN (and SDPA flash).

    python benchmarks/train_ring1.py --out train_ring1.json

Batch 1, head size 128, q/k/v/dO (b, s, h, d) in memory; SDPA gets their (b, h, s, d) views, as
a model that transposes for SDPA does, and TokenRing gets them as they are (layout bshd). Time:
CUDA events around out = f(q, k, v); out.backward(dO), gradients cleared outside the timing,
median of --iters after --warmup. Peak memory: max_memory_allocated during one forward +
backward minus what was allocated before it (the inputs). Errors: a separate, smaller shape
(--err-heads x --err-seq) against fp64 autograd of the same rounded inputs: max |out - ref|
and max |grad - ref| / max |ref| for dq, dk, dv, for every implementation.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(32, 8192, True), (32, 8192, False), (32, 16384, True), (32, 32768, True),
          (32, 32768, False), (16, 65536, True)]  # fmt: skip


def _impls(dtypes_flash: bool):
    from tokenring_xdit import token_ring_attn_func

    def sdpa(backend):
        def run(q, k, v, causal):
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal
                )
            return out.transpose(1, 2)

        return run

    impls = {
        "token_ring": lambda q, k, v, c: token_ring_attn_func(q, k, v, causal=c),
        "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
    }
    if dtypes_flash:
        impls["sdpa_flash"] = sdpa(SDPBackend.FLASH_ATTENTION)
    return impls


def _inputs(h, s, dtype, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [
        torch.randn(1, s, h, 128, device="cuda", generator=gen).to(dtype).requires_grad_(i < 3)
        for i in range(4)
    ]


def _time(fn, q, k, v, do, causal, warmup, iters) -> float:
    times = []
    for i in range(warmup + iters):
        for x in (q, k, v):
            x.grad = None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(q, k, v, causal).backward(do)
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def _peak(fn, q, k, v, do, causal) -> dict:
    for x in (q, k, v):
        x.grad = None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn(q, k, v, causal).backward(do)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return dict(peak_mib=peak / 2**20, peak_over_inputs_mib=(peak - before) / 2**20)


def _errors(fn, h, s, dtype, causal) -> dict:
    q, k, v, do = _inputs(h, s, dtype, seed=1)
    out = fn(q, k, v, causal)
    out.backward(do)
    errs = {"out": 0.0, "dq": 0.0, "dk": 0.0, "dv": 0.0}
    refs_max = {"dq": 0.0, "dk": 0.0, "dv": 0.0}
    diffs = {"dq": 0.0, "dk": 0.0, "dv": 0.0}
    for h0 in range(0, h, 8):  # fp64 reference, 8 heads at a time
        sl = slice(h0, h0 + 8)
        ref_in = [x.detach()[:, :, sl].double().transpose(1, 2).requires_grad_() for x in (q, k, v)]
        ref = F.scaled_dot_product_attention(*ref_in, is_causal=causal)
        ref.backward(do[:, :, sl].double().transpose(1, 2))
        got_out = out.detach()[:, :, sl].double().transpose(1, 2)
        errs["out"] = max(errs["out"], (got_out - ref.detach()).abs().max().item())
        for name, x, r in zip(("dq", "dk", "dv"), (q, k, v), ref_in, strict=True):
            g = x.grad[:, :, sl].double().transpose(1, 2)
            diffs[name] = max(diffs[name], (g - r.grad).abs().max().item())
            refs_max[name] = max(refs_max[name], r.grad.abs().max().item())
    for name in diffs:
        errs[name] = diffs[name] / max(refs_max[name], 1.0)
    return errs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--dtypes", default="bfloat16,float16")
    parser.add_argument("--err-heads", type=int, default=32)
    parser.add_argument("--err-seq", type=int, default=4096)
    parser.add_argument("--shapes", default="", help="h:s:c,... (c = 1 causal, 0 not)")
    parser.add_argument("--out", default="train_ring1.json")
    args = parser.parse_args()

    from tokenring_xdit.ring.kernels import select_pair

    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(x) for x in item.split(":")) for item in args.shapes.split(",")]
        shapes = [(h, s, bool(c)) for h, s, c in shapes]
    rows, errors = [], {}
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        impls = _impls(dtype == torch.bfloat16)
        pair = select_pair("auto", torch.device("cuda"), dtype, 128, 128, False).name
        for causal in (True, False):
            key = f"{dtype_name}/{'causal' if causal else 'full'}/{args.err_heads}x{args.err_seq}"
            errors[key] = {
                name: _errors(fn, args.err_heads, args.err_seq, dtype, causal)
                for name, fn in impls.items()
            }
            print(key, json.dumps(errors[key]), flush=True)
        for h, s, causal in shapes:
            q, k, v, do = _inputs(h, s, dtype)
            flops = 4 * s * s * h * 128 * 3.5 * (0.5 if causal else 1.0)  # fwd 1 + bwd 2.5
            row = dict(dtype=dtype_name, heads=h, seq=s, causal=causal, token_ring_pair=pair)
            for name, fn in impls.items():
                ms = _time(fn, q, k, v, do, causal, args.warmup, args.iters)
                row[name] = dict(ms=ms, tflops=flops / ms / 1e9, **_peak(fn, q, k, v, do, causal))
            row["speed_vs_cudnn"] = row["sdpa_cudnn"]["ms"] / row["token_ring"]["ms"]
            row["peak_vs_cudnn"] = row["token_ring"]["peak_mib"] / row["sdpa_cudnn"]["peak_mib"]
            rows.append(row)
            print(json.dumps(row), flush=True)
            del q, k, v, do
            torch.cuda.empty_cache()
    result = dict(
        machine=platform.node(),
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        cudnn=torch.backends.cudnn.version(),
        warmup=args.warmup,
        iters=args.iters,
        errors=errors,
        rows=rows,
    )
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
