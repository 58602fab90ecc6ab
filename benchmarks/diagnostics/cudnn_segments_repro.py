"""Why cuDNN per document segment failed exactness: a one-GPU repro vs fp64.

    python benchmarks/diagnostics/cudnn_segments_repro.py --out cudnn_segments_repro.json

`kernel="cudnn"` with packed documents runs the dense cuDNN record once per segment on views
of the packed tensors (ring/kernels/wrappers.py SegmentsForward/Backward around sdpa.py's
CUDNN). tests/gpu/test_gpu_packed.py saw it fail on H200 (every pair case, and the thread ring
at N = 1 and 3) while torch flash per segment passed, so packed documents refuse it.

Each line below is one case: the same segments through a per-segment loop (this file's
`run_segments`, the product wrapper's loop with switches) calling torch's cuDNN ops on every
block (`cudnn_op_forward/backward`: the record as it was when the failure was seen) against
fp64 attention of each document alone; max |error| of out, lse, dq, dk, dv (out and grads
relative to the largest |reference|, lse absolute) and a verdict. The backward is fed the
exact lse and delta with O withheld (the ring's travelling-query case) unless the case says
otherwise. Cases change ONE thing against "base" (the failing test's first block: b 2, 8
heads, 768 tokens in BSHD, documents of 1, 299 and 400 tokens, rows 700.. outside every
document):
  product-raw, product, product-flash
                           the product wrapper (segments_pair) as the GPU test drives it
                           (backward fed the forward's own lse) around the raw cuDNN ops / the
                           `cudnn` record now (one-token blocks to torch flash) / torch flash
  fixed, flash-control     "base" with the `cudnn` record now / with torch flash
  b1, bhsd, gqa, fp16      batch 1 (dense views), the other layout, 8/2 heads, fp16
  contiguous               each segment's slices copied to fresh tensors before the call
  sync                     torch.cuda.synchronize() after every kernel call
  interleave, reverse      each segment's forward and backward back to back; reversed order
  own-lse, real-o          backward fed the forward's own lse / the real O instead of delta
  lens-*                   other document lengths (no 1-token document, multiples of 128,
                           64 mod 128, many short ones), and each document alone
  full-*                   the test's second block (queries 200..767 x keys 0..499, not causal)
  whole-row                one causal document over the whole block (a dense ring's call)
  poison-gaps(-b1)         documents separated by NaN-filled tokens (does a call read outside
                           its views?); -b1: batch 1, where dO also stays a view
  lse-tail-nan             the stats tensor cuDNN reads is followed in memory by NaN (does the
                           backward read lse past s_q?)
  offset-16B / -128B       the packed tensors start 8 / 64 elements into their allocation
  keep-alive               every call's results kept alive and compared with their clones at
                           the end (does a later call write into an earlier one's memory?)
  single-*                 one dense cuDNN call on fresh contiguous tensors (no segments at
                           all): 1 to 400 tokens causal (odd, 64 mod 128, around 64 and 128),
                           568 x 500 and 512 x 512 full, and one query or one key not causal
                           (1 x 64, 1 x 43, 64 x 1, 9 x 1: the thread ring's pieces)
The summary names the switches that turn "base"'s verdict around. docs/kernels-cudnn-segments.md
ranks the hypotheses and says what each line decides.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
import traceback
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from tests.reference import exact_attention, exact_grads  # noqa: E402
from tokenring_xdit.ring.segments import Segment
from tokenring_xdit.ring.kernels import Kernel, empty_partial, gqa_pair, row_delta  # noqa: E402
from tokenring_xdit.ring.kernels.sdpa import cudnn_op_backward, cudnn_op_forward  # noqa: E402
from tokenring_xdit.ring.tensor_layout import BHSD, BSHD, Layout

D = 128
# torch's cuDNN ops on every block: the `cudnn` record as it was when the failure was seen (it
# now sends blocks with one query or one key to torch flash)
RAW_CUDNN = Kernel("cudnn-raw", cudnn_op_forward, cudnn_op_backward, False, half_only=True)
TOL = 4e-2  # out / grads, relative to the largest |reference| (tests/gpu/test_gpu_packed.py)
LSE_TOL = 1e-2  # absolute
# the failing test's first block: a 1-token document, then 299 and 400; rows 700.. see nothing
BASE_SEGS = (Segment(0, 1, 0, 1, True), Segment(1, 300, 1, 300, True),
             Segment(300, 700, 300, 700, True))  # fmt: skip


@dataclass(frozen=True)
class Case:
    """One repro case: the packed block and how the per-segment loop runs it."""

    name: str
    segs: tuple[Segment, ...] = BASE_SEGS
    s: int = 768
    b: int = 2
    h: int = 8
    h_kv: int = 8
    layout: Layout = BSHD
    dtype: torch.dtype = torch.bfloat16
    offset: int = 0  # elements between the allocation's start and the packed tensors
    contiguous: bool = False
    sync: bool = False
    interleave: bool = False
    reverse: bool = False
    own_lse: bool = False
    real_o: bool = False
    poison: bool = False  # NaN in every token outside the documents
    lse_tail_nan: bool = False
    keep_alive: bool = False
    # the dense record per segment: "cudnn-raw" (torch's cuDNN op on every block, as the record
    # was when the failure was seen), "cudnn" (the record now), "torch_flash"; CPU: "math"
    kernel: str = "cudnn-raw"
    product: bool = False  # through the product's segments_pair instead of run_segments


def cases() -> list[Case]:
    base = Case("base")
    v = dataclasses.replace
    gaps = (Segment(0, 299, 0, 299, True), Segment(363, 662, 363, 662, True))
    out = [
        v(base, name="product-raw", product=True),
        v(base, name="product", product=True, kernel="cudnn"),
        v(base, name="product-flash", product=True, kernel="torch_flash"),
        base,
        v(base, name="fixed", kernel="cudnn"),
        v(base, name="flash-control", kernel="torch_flash"),
        v(base, name="b1", b=1),
        v(base, name="bhsd", layout=BHSD),
        v(base, name="gqa", h_kv=2),
        v(base, name="fp16", dtype=torch.float16),
        v(base, name="contiguous", contiguous=True),
        v(base, name="sync", sync=True),
        v(base, name="interleave", interleave=True),
        v(base, name="reverse", reverse=True),
        v(base, name="own-lse", own_lse=True),
        v(base, name="real-o", real_o=True),
        v(base, name="lens-no-1", segs=(Segment(0, 300, 0, 300, True), BASE_SEGS[2])),
        v(base, name="lens-x128", segs=_docs((128, 256, 384))),
        v(base, name="lens-64mod128", segs=_docs((64, 192, 448))),
        v(base, name="lens-many-short", segs=_docs((1, 2, 3, 5, 17, 31, 64, 77, 100, 150))),
        *(v(base, name=f"lens-alone-{s.q1 - s.q0}", segs=(s,)) for s in BASE_SEGS),
        v(base, name="full-568x500", segs=(Segment(200, 768, 0, 500, False),)),
        v(base, name="full-512x512", segs=(Segment(256, 768, 0, 512, False),)),
        v(
            base,
            name="full-568x500-contiguous",
            segs=(Segment(200, 768, 0, 500, False),),
            contiguous=True,
        ),  # fmt: skip
        v(base, name="whole-row", segs=(Segment(0, 768, 0, 768, True),)),
        v(base, name="poison-gaps", segs=gaps, poison=True),
        v(base, name="poison-gaps-b1", segs=gaps, poison=True, b=1),
        v(base, name="gaps-no-poison", segs=gaps),
        v(base, name="lse-tail-nan", lse_tail_nan=True),
        v(base, name="offset-16B", offset=8),
        v(base, name="offset-128B", offset=64),
        v(base, name="keep-alive", keep_alive=True),
    ]
    lengths = (1, 2, 3, 8, 17, 33, 63, 64, 65, 100, 127, 129, 192, 299, 320, 400)
    singles = [(n, n, True) for n in lengths] + [
        (568, 500, False), (512, 512, False), (1, 64, False), (1, 43, False), (64, 1, False),
        (9, 1, False),
    ]  # fmt: skip
    for n_q, n_k, causal in singles:
        seg = Segment(0, n_q, 0, n_k, causal)
        out.append(Case(f"single-{n_q}x{n_k}{'-causal' if causal else ''}", segs=(seg,),
                        s=max(n_q, n_k), b=1, contiguous=True))  # fmt: skip
    return out


def for_cpu(case: Case) -> Case:
    """The case with the exact `math` kernel and 2 query heads (GQA keeps 1 K/V head): what
    checks this script's bookkeeping without a GPU."""
    return dataclasses.replace(case, kernel="math", h=2, h_kv=2 if case.h_kv == case.h else 1)


def _docs(lengths) -> tuple[Segment, ...]:
    """Causal documents of these lengths, back to back from token 0."""
    segs, start = [], 0
    for n in lengths:
        segs.append(Segment(start, start + n, start, start + n, True))
        start += n
    return tuple(segs)


def covered(segs, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(query rows, key rows) that some document covers, as bool masks of length s."""
    rows, keys = torch.zeros(s, dtype=torch.bool), torch.zeros(s, dtype=torch.bool)
    for seg in segs:
        rows[seg.q0 : seg.q1] = True
        keys[seg.k0 : seg.k1] = True
    return rows, keys


def inputs(case: Case, device) -> tuple[torch.Tensor, ...]:
    """q, k, v, dout in the case's layout, `offset` elements into their allocations; with
    `poison`, NaN in every token no document covers."""
    gen = torch.Generator(device="cpu").manual_seed(4)
    rows, keys = covered(case.segs, case.s)
    out = []
    for heads, mine in ((case.h, rows), (case.h_kv, keys), (case.h_kv, keys), (case.h, rows)):
        x = torch.randn(case.b, heads, case.s, D, generator=gen)
        if case.poison:
            x[:, :, ~mine] = float("nan")
        x = case.layout.from_bhsd(x).contiguous()
        buf = torch.empty(x.numel() + case.offset, dtype=case.dtype, device=device)
        out.append(buf[case.offset :].view(x.shape).copy_(x))
    return tuple(out)


def reference(case: Case, q, k, v, do):
    """fp64 attention of each document alone, (b, h, s, ...) : out, lse, dq, dk, dv; rows
    outside every document: out 0, lse -inf, no gradient."""
    lay = case.layout
    qb, kb, vb, dob = (lay.to_bhsd(x).double() for x in (q, k, v, do))
    out, dq = torch.zeros_like(qb), torch.zeros_like(qb)
    dk, dv = torch.zeros_like(kb), torch.zeros_like(vb)
    lse = torch.full(qb.shape[:3], float("-inf"), dtype=torch.float64, device=q.device)
    for seg in case.segs:
        qs, ks = slice(seg.q0, seg.q1), slice(seg.k0, seg.k1)
        args = (qb[:, :, qs], kb[:, :, ks], vb[:, :, ks])
        o, lse[:, :, qs] = exact_attention(*args, causal=seg.causal, layout="bhsd")
        out[:, :, qs] = o
        _, gq, gk, gv = exact_grads(*args, dob[:, :, qs], causal=seg.causal, layout="bhsd")
        dq[:, :, qs] += gq
        dk[:, :, ks] += gk
        dv[:, :, ks] += gv
    return out, lse, dq, dk, dv


def _fresh(x: torch.Tensor, contiguous: bool) -> torch.Tensor:
    return x.clone(memory_format=torch.contiguous_format) if contiguous else x


def _lse_with_nan_tail(lse: torch.Tensor) -> torch.Tensor:
    """lse's values in a contiguous tensor whose allocation continues with NaN."""
    buf = torch.full((lse.numel() + 4096,), float("nan"), dtype=torch.float32, device=lse.device)
    return buf[: lse.numel()].view(lse.shape).copy_(lse)


def run_segments(case: Case, dense, q, k, v, do, exact_lse) -> dict:
    """The product wrapper's per-segment loop (forward: out/lse of each segment written into
    the block's; backward: each segment's grads added), with the case's switches. Returns
    out, lse, dq, dk, dv in BHSD order and `clobbered` (keep_alive)."""
    lay, scale, sync = case.layout, D**-0.5, case.sync and q.is_cuda
    seq = lay.seq_slice
    segs = list(reversed(case.segs)) if case.reverse else list(case.segs)
    out, lse = empty_partial(q, v, lay)
    dq, dk, dv = (torch.zeros_like(x) for x in (q, k, v))
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []

    def fwd(seg):
        qs, ks = slice(seg.q0, seg.q1), slice(seg.k0, seg.k1)
        args = (_fresh(seq(x, s), case.contiguous) for x, s in ((q, qs), (k, ks), (v, ks)))
        o, blse = dense.run_forward(*args, scale, lay, seg.causal)
        if sync:
            torch.cuda.synchronize()
        if case.keep_alive:
            kept.extend((t, t.clone()) for t in (o, blse))
        seq(out, qs).copy_(o)
        lse[:, :, qs] = blse

    def bwd(seg):
        qs, ks = slice(seg.q0, seg.q1), slice(seg.k0, seg.k1)
        # the lse of the whole row, as the ring feeds it (the exact one, or the forward's own)
        row_lse = (lse if case.own_lse else exact_lse)[:, :, qs].contiguous()
        if case.lse_tail_nan:
            row_lse = _lse_with_nan_tail(row_lse)
        o = _fresh(seq(out, qs), case.contiguous) if case.real_o else None
        delta = row_delta(do, out, lay)[:, :, qs].contiguous()
        views = ((do, qs), (q, qs), (k, ks), (v, ks))
        args = [_fresh(seq(x, s), case.contiguous) for x, s in views]
        grads = dense.run_backward(*args, o, row_lse, delta, scale, lay, seg.causal)
        if sync:
            torch.cuda.synchronize()
        if case.keep_alive:
            kept.extend((t, t.clone()) for t in grads)
        for g, x, sl in zip(grads, (dq, dk, dv), (qs, ks, ks), strict=True):
            seq(x, sl).add_(g)

    if case.interleave:
        for seg in segs:
            fwd(seg)
            bwd(seg)
    else:
        for seg in segs:
            fwd(seg)
        for seg in segs:
            bwd(seg)
    names = ("out", "lse", "dq", "dk", "dv")
    res = dict(zip(names, (lay.to_bhsd(out), lse, *map(lay.to_bhsd, (dq, dk, dv))), strict=True))
    res["clobbered"] = any(not torch.equal(t, c) for t, c in kept)
    return res


def errors(got: dict, ref, rows: torch.Tensor) -> dict:
    """max |error| per result (out/grads relative to the largest |reference|, lse absolute on
    rows inside documents), NaN flags, and the verdict."""
    out = {}
    for name, r in zip(("out", "lse", "dq", "dk", "dv"), ref, strict=True):
        g = got[name].double()
        if name == "lse":
            g, r = g[:, :, rows], r[:, :, rows]
            out["lse"] = (g - r).abs().max().item()
        else:
            out[name] = ((g - r).abs().max() / r.abs().max().clamp_min(1)).item()
        out[f"{name}_nan"] = bool(torch.isnan(g).any())
    bad = [n for n in ("out", "lse", "dq", "dk", "dv") if not out[n] <= _tol(n)]
    if got.get("clobbered"):
        bad.append("clobbered")
    out["verdict"] = "ok" if not bad else "FAIL " + ",".join(bad)
    return out


def _tol(name: str) -> float:
    return LSE_TOL if name == "lse" else TOL


def run_case(case: Case, device) -> dict:
    from tokenring_xdit.ring.kernels import REGISTRY

    q, k, v, do = inputs(case, device)
    ref = reference(case, q, k, v, do)
    dense = RAW_CUDNN if case.kernel == "cudnn-raw" else REGISTRY[case.kernel]
    if case.h_kv != case.h:
        dense = gqa_pair(dense, torch.device(device), case.dtype, D, D)
    if case.product:
        got = run_product(case, dense, q, k, v, do)
    else:
        got = run_segments(case, dense, q, k, v, do, ref[1].float())
    return errors(got, ref, covered(case.segs, case.s)[0].to(device))


def run_product(case: Case, dense, q, k, v, do) -> dict:
    """The product path itself, as tests/gpu/test_gpu_packed.py drives it: segments_pair
    around the dense record, the backward fed the forward's own lse (0 on rows without keys)
    and delta, O withheld."""
    from tokenring_xdit.ring.kernels import segments_pair

    lay, scale, pair = case.layout, D**-0.5, segments_pair(dense)
    out, lse = pair.run_forward(q, k, v, scale, lay, case.segs)
    glse = torch.where(lse.isinf(), torch.zeros_like(lse), lse)
    delta = row_delta(do, out, lay)
    grads = pair.run_backward(do, q, k, v, None, glse, delta, scale, lay, case.segs)
    names = ("out", "lse", "dq", "dk", "dv")
    return dict(zip(names, (lay.to_bhsd(out), lse, *(lay.to_bhsd(g) for g in grads)), strict=True))


def versions() -> dict:
    return {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "python": platform.python_version(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="cudnn_segments_repro.json")
    parser.add_argument("--only", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--budget-s", type=float, default=105.0, help="start no case after this")
    parser.add_argument(
        "--cpu-check", action="store_true",
        help="run the cases on the CPU with the exact kernel and 2 heads (checks this script)",
    )  # fmt: skip
    args = parser.parse_args()
    t0 = time.perf_counter()
    res: dict = {"versions": versions(), "cases": {}, "skipped": []}
    print(json.dumps(res["versions"]), flush=True)
    wanted = set(filter(None, args.only.split(",")))
    for case in cases():
        if args.cpu_check:
            case = for_cpu(case)
        if wanted and case.name not in wanted:
            continue
        if time.perf_counter() - t0 > args.budget_s:
            res["skipped"].append(case.name)
            continue
        try:
            r = run_case(case, "cpu" if args.cpu_check else "cuda")
        except Exception as exc:  # noqa: BLE001 - a case that raises is a result too
            r = {"verdict": f"ERROR {type(exc).__name__}: {str(exc)[:200]}",
                 "traceback": traceback.format_exc()[-1500:]}  # fmt: skip
        res["cases"][case.name] = r
        errs = " ".join(f"{n} {r[n]:.1e}" for n in ("out", "lse", "dq", "dk", "dv") if n in r)
        line = f"{case.name:24s} {errs}  {r['verdict']}"
        print(f"[{time.perf_counter() - t0:4.0f} s] {line}", flush=True)
    res["summary"] = summary(res["cases"])
    res["summary"]["skipped_for_time"] = res["skipped"]
    print(json.dumps(res["summary"], indent=1))
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


def summary(results: dict) -> dict:
    """Which one-switch cases turn base's verdict around (the trigger's candidates)."""
    base = results.get("base", {}).get("verdict", "?")
    flips = [n for n, r in results.items() if n != "base" and not n.startswith("single-")
             and (r["verdict"] == "ok") != (base == "ok")]  # fmt: skip
    singles = {n: r["verdict"] for n, r in results.items() if n.startswith("single-")}
    return {"base": base, "flip_base_verdict": flips, "single_dense_calls": singles}


if __name__ == "__main__":
    main()
