"""One rank's training work at ring N, replayed on ONE GPU, vs whole-sequence cuDNN time / N.

    python benchmarks/replay_rank.py --out replay_rank.json
    python benchmarks/replay_rank.py --rings 2,4,8 --tokens 8192,16384,32768 --heads 32

The replay runs TokenRing's own training loops (`ring/training/forward.py`, `ring/training/backward.py`)
for rank --rank of a ring of N with the real schedules (`ring/schedules/`: causal zigzag and the
non-causal table), the real kernel pair and every per-step op the rank runs (merges, the O
stand-in, dK/dV/dQ sums), but on a ring object whose lanes are local: a post fills each
receive buffer from a random pool (one copy, what the transfer would write) and sends nothing.
So it times the rank's compute at ring N without N GPUs; communication (hidden behind the
kernels on a fast fabric) is not in it.

Per (N, tokens per rank T, causal), batch 1, head size 128, bf16 by default:
- replay_ms: forward + backward of the rank (median of --iters); with --hold-back also
  replay_hold_back_ms, the same with the own block split by heads (ring/training/hold_back.py): its cost
  without the transfers it hides (they are free here);
- kernels_ms: the same block kernels alone (the schedule's shapes and order, forward then
  backward, nothing else): the split's pure kernel time;
- whole_ms: SDPA cuDNN forward + backward over the whole sequence of N*T tokens;
- ratio = replay_ms / (whole_ms / N): 1.0 means the split costs nothing per rank;
- standin_ms: one O stand-in pass for T travelling queries (paid at N-1 steps or fewer), and the
  backward Q lane's bytes per token with delta (what TokenRing sends) and with O instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import platform
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.local_ring import LocalRing  # noqa: E402


def _timed(fn, warmup: int, iters: int) -> float:
    times = []
    for i in range(warmup + iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def _replay_fn(call, rank, n, q, k, v, do):
    from tokenring_xdit.ring.training.backward import block_backward
    from tokenring_xdit.ring.training.forward import block_forward

    ring = LocalRing(rank, n)
    q_lens = (q.shape[1],) * n

    def run():
        out, lse = block_forward(call, ring, q_lens, q, k, v)
        block_backward(call, ring, q_lens, do, q, k, v, out, lse)

    return run


def _kernels_fn(call, rank, n, q, k, v, do):
    """The schedule's block kernels alone, forward then backward, on preallocated blocks."""
    from tokenring_xdit.ring.kernels import row_delta
    from tokenring_xdit.ring.schedules.blocks import part_slice

    lay, t = call.layout, q.shape[1]
    blocks = []
    for st in call.schedule.block_steps(rank, n):
        if not st.kernel:
            continue
        qs, ks = part_slice(st.q_part, t), part_slice(st.kv_part, t)
        qb, dob = (lay.seq_slice(x, qs).contiguous() for x in (q, do))
        kb, vb = lay.seq_slice(k, ks), lay.seq_slice(v, ks)
        blocks.append((st, qb, kb, vb, dob))
    outs = [call.pair.run_forward(qb, kb, vb, call.scale, lay, st.causal)
            for st, qb, kb, vb, _ in blocks]  # fmt: skip
    deltas = [
        row_delta(dob, o, lay) for (_, _, _, _, dob), (o, _) in zip(blocks, outs, strict=True)
    ]

    def run():
        for st, qb, kb, vb, _ in blocks:
            call.pair.run_forward(qb, kb, vb, call.scale, lay, st.causal)
        for (st, qb, kb, vb, dob), (o, lse), delta in zip(blocks, outs, deltas, strict=True):
            own = o if st.step == 0 else None
            call.pair.run_backward(dob, qb, kb, vb, own, lse, delta, call.scale, lay, st.causal)

    return run


def _whole_fn(q, k, v, do, causal):
    def run():
        for x in (q, k, v):
            x.grad = None
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal
            )
        out.backward(do.transpose(1, 2))

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rings", default="2,4,8")
    parser.add_argument("--tokens", default="8192,16384,32768", help="tokens per rank")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--kernel", default="auto")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--no-whole", action="store_true", help="skip the whole-sequence runs")
    parser.add_argument("--hold-back", action="store_true", help="also replay train_hold_back")
    parser.add_argument("--out", default="replay_rank.json")
    args = parser.parse_args()

    from tokenring_xdit.ring.training.forward import BlockCall
    from tokenring_xdit.ring.kernels import select_pair
    from tokenring_xdit.ring.tensor_layout import BSHD
    from tokenring_xdit.ring.schedules import CAUSAL_ZIGZAG, NON_CAUSAL_BLOCKS
    from tokenring_xdit.ring.kernels.standin import out_standin_bhsd

    dtype, h, d = getattr(torch, args.dtype), args.heads, 128
    pair = select_pair(args.kernel, torch.device("cuda"), dtype, d, d, False)
    rows = []
    for n in map(int, args.rings.split(",")):
        for t in map(int, args.tokens.split(",")):
            for causal in (True, False):
                schedule = CAUSAL_ZIGZAG if causal else NON_CAUSAL_BLOCKS
                call = BlockCall(schedule=schedule, pair=pair, layout=BSHD, scale=d**-0.5)
                gen = torch.Generator(device="cuda").manual_seed(n * t)
                q, k, v, do = (
                    torch.randn(1, t, h, d, device="cuda", generator=gen).to(dtype)
                    for _ in range(4)
                )
                row = dict(ring=n, tokens_per_rank=t, causal=causal, heads=h, rank=args.rank,
                           pair=pair.name, dtype=args.dtype)  # fmt: skip
                run = _replay_fn(call, args.rank, n, q, k, v, do)
                row["replay_ms"] = _timed(run, args.warmup, args.iters)
                if args.hold_back:
                    held = dataclasses.replace(call, hold_back=True)
                    run = _replay_fn(held, args.rank, n, q, k, v, do)
                    row["replay_hold_back_ms"] = _timed(run, args.warmup, args.iters)
                run = _kernels_fn(call, args.rank, n, q, k, v, do)
                row["kernels_ms"] = _timed(run, args.warmup, args.iters)
                # the O stand-in of one travelling block of T queries (what the ring pays per
                # step instead of sending O: (Q, dO, lse, delta) = 2*d*e + 8 bytes per token and
                # head, (Q, dO, O, lse) would be 3*d*e + 4)
                do_b = do.transpose(1, 2)
                delta = torch.randn(1, h, t, device="cuda", generator=gen)
                row["standin_ms"] = _timed(functools.partial(out_standin_bhsd, do_b, delta), 1, 5)
                row["lane_bytes_per_token_delta"] = h * (2 * d * do.element_size() + 8)
                row["lane_bytes_per_token_with_o"] = h * (3 * d * do.element_size() + 4)
                del run, q, k, v, do, do_b, delta
                torch.cuda.empty_cache()
                if not args.no_whole:
                    big = [
                        torch.randn(1, n * t, h, d, device="cuda", generator=gen)
                        .to(dtype)
                        .requires_grad_(i < 3)
                        for i in range(4)
                    ]
                    row["whole_ms"] = _timed(_whole_fn(*big, causal), args.warmup, args.iters)
                    row["ratio"] = row["replay_ms"] / (row["whole_ms"] / n)
                    row["kernels_ratio"] = row["kernels_ms"] / (row["whole_ms"] / n)
                    del big
                    torch.cuda.empty_cache()
                rows.append(row)
                print(json.dumps(row), flush=True)
    result = dict(
        machine=platform.node(),
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        cudnn=torch.backends.cudnn.version(),
        warmup=args.warmup,
        iters=args.iters,
        rows=rows,
    )
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
