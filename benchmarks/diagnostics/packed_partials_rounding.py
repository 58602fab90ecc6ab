"""Is the packed ring's extra dK/dV error the bf16 rounding of its partials?

CPU only, no kernel: every gradient term is exact (fp64); only the roundings the ring's data
path does are emulated. Per (rank, step) block of the causal zigzag schedule (the plan the ring
runs: `doc_plan`, positions from `shard_positions`) and per segment of it, the fp64 partial
dQ/dK/dV is rounded to bf16 per expanded query head (the kernel's output); segments of one block
that share keys are added in bf16 (the kernel wrappers add into a bf16 buffer); dK/dV are folded
over each GQA group in fp32 and rounded (fold_kv_grad); the blocks' partials of a position are
summed in fp32 from N = 3 (in bf16 at N = 2) and rounded once (backward.py). "whole": the same
fp64 gradient of each whole document rounded once per expanded head and folded (what one SDPA
call per document gives, minus its kernel's inner rounding).

Per layout, ring size and rank: max error of dq/dk/dv vs fp64, relative to the rank's max
magnitude, for the ring's roundings and the whole-document ones, their ratio, and the most
partials a position sums; "layouts" with exact partials, "inner_bf16" with P and dS also
rounded to bf16 inside each kernel call, as flash's backward does.

Found (tests/gpu/test_gpu_packed.py's row, GQA 8/2, d 128): with inner_bf16 the zigzag's rank 1
at ring 4 gets dk 7.65e-3, the error measured on 4 x H200 for the ring (which runs flash_varlen
there); the decomposition's roundings alone give 1.5-2.2x the whole-document error for dk on
some ranks of both layouts: the ring's gap is its block sums, not a bug.

  python3 benchmarks/diagnostics/packed_partials_rounding.py --out $OUT/partials.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.packed_blocks import blocks, max_partials  # noqa: E402

API_DOCS = (0, 1, 2900, 2901, 3333, 4100, 4101, 6144)  # tests/gpu/test_gpu_packed.py's row
BF16, F32, F64 = torch.bfloat16, torch.float32, torch.float64


def inputs(total: int, h: int, hk: int, d: int, seed: int = 11):
    """q, k, v, do as _api_worker makes them (bf16 values; (h, total, d), batch dropped)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q, do = (torch.randn(1, h, total, d, generator=gen).bfloat16()[0] for _ in "qo")
    k, v = (torch.randn(1, hk, total, d, generator=gen).bfloat16()[0] for _ in "kv")
    return q, k, v, do


def _round_add(acc: torch.Tensor, x: torch.Tensor) -> None:
    """acc += x in acc's dtype (one rounding of the fp32 sum, as torch's bf16 add_)."""
    wide = F64 if acc.dtype == F64 else F32
    acc.copy_((acc.to(wide) + x.to(wide)).to(acc.dtype))


def emulate(
    bounds=API_DOCS,
    rings=(2, 4),
    layouts=("zigzag", "documents"),
    h=8,
    hk=2,
    d=128,
    out=BF16,
    inner=False,
):
    """{layout: {ring: [per rank {grad: {"ring", "whole", "ratio", "max_partials"}}]}}.
    `out`: the kernels' output dtype (float64: no rounding anywhere, the sums must be exact).
    `inner`: also round what a flash-style kernel rounds inside before its gradient GEMMs (P
    and dS = P (dP - D) to bf16, D from the bf16 O), in the partials and the whole documents
    alike (the kernel's fp32 accumulation stays exact)."""
    total, g, scale = bounds[-1], h // hk, d**-0.5
    q, k, v, do = inputs(total, h, hk, d)
    configs = {(lay, n): blocks(bounds, n, lay) for lay in layouts for n in rings}
    # per block: bf16 partials per expanded head (dq over the query tile, dk/dv over the keys)
    parts = {
        c: [
            [torch.zeros(h, len(b.q_tile), d, dtype=out)]
            + [torch.zeros(h, len(b.k_tile), d, dtype=out) for _ in "kv"]
            for b in bl
        ]
        for c, (bl, _) in configs.items()
    }
    exact = [torch.zeros(h, total, d, dtype=F64) for _ in "qkv"]  # per expanded head
    kernel = [torch.zeros(h, total, d, dtype=F64) for _ in "qkv"]  # with `inner` roundings
    for a, b in zip(bounds, bounds[1:], strict=False):
        for head in range(h):
            qq, dd = q[head, a:b].to(F64), do[head, a:b].to(F64)
            kk, vv = k[head // g, a:b].to(F64), v[head // g, a:b].to(F64)
            s = (qq @ kk.T) * scale
            s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
            p = torch.exp(s - torch.logsumexp(s, -1, keepdim=True))
            dp = dd @ vv.T
            ds = p * (dp - ((p @ vv) * dd).sum(-1, keepdim=True))
            exact[0][head, a:b], exact[1][head, a:b] = scale * ds @ kk, scale * ds.T @ qq
            exact[2][head, a:b] = p.T @ dd
            if inner:
                o_half = (p @ vv).to(BF16).to(F64)
                ds = (p * (dp - (o_half * dd).sum(-1, keepdim=True))).to(BF16).to(F64)
                p = p.to(BF16).to(F64)
            ds = ds * scale
            kernel[0][head, a:b], kernel[1][head, a:b] = ds @ kk, ds.T @ qq
            kernel[2][head, a:b] = p.T @ dd
            for c, (bl, _) in configs.items():
                for bi, blk in enumerate(bl):
                    for sg in blk.segs:
                        qi, ki = blk.q_tile[sg.q0 : sg.q1], blk.k_tile[sg.k0 : sg.k1]
                        if int(qi[0]) < a or int(qi[0]) >= b:
                            continue  # another document's segment
                        qi, ki = qi - a, ki - a
                        sub_ds, sub_p = ds[qi][:, ki], p[qi][:, ki]
                        acc = parts[c][bi]
                        _round_add(acc[0][head, sg.q0 : sg.q1], (sub_ds @ kk[ki]).to(out))
                        _round_add(acc[1][head, sg.k0 : sg.k1], (sub_ds.T @ qq[qi]).to(out))
                        _round_add(acc[2][head, sg.k0 : sg.k1], (sub_p.T @ dd[qi]).to(out))

    def fold(x: torch.Tensor, dtype) -> torch.Tensor:  # (h, s, d) -> (hk, s, d)
        return x.to(F64 if dtype == F64 else F32).unflatten(0, (hk, g)).sum(1).to(dtype)

    want = [exact[0], fold(exact[1], F64), fold(exact[2], F64)]
    whole = [kernel[0].to(out), fold(kernel[1].to(out), out), fold(kernel[2].to(out), out)]
    result: dict = {}
    for (lay, n), (bl, pos) in configs.items():
        acc_dtype = out if n == 2 or out == F64 else F32
        ranks = []
        for r in range(n):
            sums = [torch.zeros(h, len(pos[r]), d, dtype=acc_dtype)]
            sums += [torch.zeros(hk, len(pos[r]), d, dtype=acc_dtype) for _ in "kv"]
            for bi, blk in sorted(enumerate(bl), key=lambda e: e[1].step):
                dq, dk, dv = parts[(lay, n)][bi]
                if blk.owner == r:  # the dQ partial comes home
                    _round_add(sums[0][:, blk.q_sl], dq)
                if blk.rank == r:  # dK/dV summed where they are made
                    _round_add(sums[1][:, blk.k_sl], fold(dk, out))
                    _round_add(sums[2][:, blk.k_sl], fold(dv, out))
            grads = {}
            for name, got, ref, w in zip("qkv", sums, want, whole, strict=True):
                ref_r, mag = ref[:, pos[r]], ref[:, pos[r]].abs().max().item()
                e_ring = (got.to(out).to(F64) - ref_r).abs().max().item() / mag
                e_whole = (w[:, pos[r]].to(F64) - ref_r).abs().max().item() / mag
                grads["d" + name] = {
                    "ring": e_ring,
                    "whole": e_whole,
                    "ratio": e_ring / e_whole if e_whole else float("inf"),
                    "max_partials": max_partials(bl, r, len(pos[r]), name),
                }
            ranks.append(grads)
        result.setdefault(lay, {})[str(n)] = ranks
    return result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rings", default="2,4")
    ap.add_argument("--docs", default=",".join(map(str, API_DOCS)), help="cu_seqlens")
    ap.add_argument("--heads", default="8,2", help="query heads, K/V heads")
    ap.add_argument("--d", type=int, default=128)
    args = ap.parse_args(argv)
    rings = tuple(int(x) for x in args.rings.split(","))
    docs = tuple(int(x) for x in args.docs.split(","))
    h, hk = (int(x) for x in args.heads.split(","))
    res = {"docs": list(docs), "heads": [h, hk], "d": args.d, "seed": 11}
    shape = {"h": h, "hk": hk, "d": args.d}
    res["layouts"] = emulate(docs, rings, **shape)
    res["inner_bf16"] = emulate(docs, rings, **shape, inner=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    for mode in ("layouts", "inner_bf16"):
        for lay, by_n in res[mode].items():
            for n, ranks in by_n.items():
                for r, gr in enumerate(ranks):
                    row = "  ".join(
                        f"{k} {x['ring']:.2e}/{x['whole']:.2e}={x['ratio']:.2f}"
                        for k, x in gr.items()
                    )
                    print(f"{mode:10s} {lay:9s} ring {n} rank {r}: {row}")
    return res


if __name__ == "__main__":
    main()
