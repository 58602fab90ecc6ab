"""Sliding windows (`window_size=`) through the public call on real gloo ranks, ring 1-4: out, dq,
dk, dv against autograd of float64 attention over the whole sequence under the window's mask;
windows inside a shard, over several and past the sequence; causal zigzag and contiguous splits
(a dense row cut contiguous without cu_seqlens), non-causal; MHA and GQA 4/2; packed documents,
on the row's split and in the documents layout (windows inside a piece, over shards, wider than
the documents; causal and not); bf16; no-grad; torch.compile(fullgraph) of a
windowed call (compiled == eager); the kernels each rank runs against the window plan; and bad
input refused with one clear error on every rank.

One launch per ring size runs the whole case matrix (CI has 2 cores); tests assert on the cached
results.
"""

from __future__ import annotations

import functools

import pytest

from tests.harness import run_ranks, values
from tests.reference import case_failures, max_err
from tests.window_ring import window_mask

WORLD_SIZES = [1, 2, 3, 4]
FP32_TOL = 2e-5
# bf16 inputs, fp64 reference on the same (rounded) inputs; values are O(1) here
BF16_TOL = {"out": 2e-2, "dq": 6e-2, "dk": 6e-2, "dv": 6e-2}


def _case(name, window, *, causal=True, split="zigzag", h=2, h_kv=2, local=8, docs=None,
          layout="bshd", dtype="float32", grad=True, seed=0):  # fmt: skip
    """split: "zigzag", "contiguous" (causal; non-causal shards are contiguous) or
    "documents" (packed); docs: packed documents as cut points inside the sequence, in twelfths
    of it (0 and the end are added)."""
    return dict(name=name, window=window, causal=causal, split=split, h=h, h_kv=h_kv,
                local=local, docs=docs, layout=layout, dtype=dtype, grad=grad,
                seed=seed)  # fmt: skip


_DOCS = dict(split="documents", docs=(3, 8))  # (the documents layout's cases)
CASES = [
    _case("zigzag-inside-chunk-mha", (2, 0), seed=1),
    _case("zigzag-over-shards-gqa42", (11, 0), h=4, h_kv=2, seed=2),
    _case("zigzag-past-sequence-bhsd", (100, 0), layout="bhsd", seed=3),
    _case("contiguous-inside-shard-gqa42", (3, 0), split="contiguous", h=4, h_kv=2, seed=4),
    _case("contiguous-over-shards-mha", (13, 0), split="contiguous", seed=5),
    _case("noncausal-band-gqa42", (3, 2), causal=False, h=4, h_kv=2, seed=6),
    _case("noncausal-right-only-mha", (-1, 5), causal=False, seed=7),
    _case("noncausal-left-over-shards", (17, -1), causal=False, layout="bhsd", seed=8),
    _case("packed-zigzag-gqa42", (4, 0), h=4, h_kv=2, local=12, docs=(5, 7), seed=9),
    _case("packed-contiguous-mha", (6, 0), split="contiguous", local=12, docs=(3, 9), seed=10),
    _case(
        "packed-noncausal-gqa42", (3, 2), causal=False, h=4, h_kv=2, local=12, docs=(5, 6), seed=11
    ),
    _case("documents-inside-piece-gqa42", (1, 0), h=4, h_kv=2, local=24, **_DOCS, seed=15),
    _case("documents-over-shards-mha", (13, 0), local=12, **_DOCS, seed=16),
    _case("documents-past-documents-bhsd", (100, 0), layout="bhsd", local=12, **_DOCS, seed=17),
    _case("documents-noncausal-mha", (3, 2), causal=False, local=12, **_DOCS, seed=18),
    _case("bf16-zigzag-gqa42", (5, 0), h=4, h_kv=2, dtype="bfloat16", seed=12),
    _case("bf16-noncausal-mha", (4, 4), causal=False, dtype="bfloat16", seed=13),
    _case("nograd-noncausal-gqa42", (2, 6), causal=False, h=4, h_kv=2, grad=False, seed=14),
]
NARROW = "zigzag-inside-chunk-mha"  # its kernel count is checked against the full table too


def _bounds(case, total):
    """cu_seqlens of the case's packed documents (None: dense): cut points in twelfths."""
    if case["docs"] is None:
        return None
    return [0, *(c * total // 12 for c in case["docs"]), total]


def _split(case, n):
    """The case's split (make_split; a dense row cut contiguous passes no cu_seqlens)."""
    from tokenring_xdit import make_split

    total = case["local"] * n
    cu = _bounds(case, total)
    return make_split(total, n, causal=case["causal"], cu_seqlens=cu, layout=case["split"])


def _reference(case, total, q, k, v, do, torch):
    """(out, dq, dk, dv) float64 in (b, S, h, d): attention under the window's mask (within
    documents), GQA by repeating K/V heads, autograd for the gradients."""
    xs = [x.detach().double().transpose(1, 2).requires_grad_() for x in (q, k, v)]
    g = case["h"] // case["h_kv"]
    kk, vv = (x.repeat_interleave(g, dim=1) for x in xs[1:])
    mask = window_mask(total, case["window"], case["causal"], _bounds(case, total))
    scores = (xs[0] @ kk.transpose(-1, -2)) * q.shape[-1] ** -0.5
    out = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ vv
    out.backward(do.double().transpose(1, 2))
    return [x.detach().transpose(1, 2) for x in (out, *(x.grad for x in xs))]


def _run_case(case, rank, n, torch):
    """Max |err| of out (and dq, dk, dv) on this rank through token_ring_attn, and the kernels
    this rank ran in the forward and the backward."""
    from tokenring_xdit import shard, token_ring_attn
    from tokenring_xdit.ring.comm import COUNTERS

    total, b, d = case["local"] * n, 1, 8
    gen = torch.Generator().manual_seed(700 + case["seed"])
    dtype = getattr(torch, case["dtype"])
    shapes = [(b, total, h, d) for h in (case["h"], case["h_kv"], case["h_kv"], case["h"])]
    q, k, v, do = (torch.randn(*s, generator=gen, dtype=torch.float64).to(dtype) for s in shapes)
    refs = _reference(case, total, q, k, v, do, torch)
    split = _split(case, n)

    def local(x):
        x = shard(x, split=split)
        return (x.transpose(1, 2) if case["layout"] == "bhsd" else x).contiguous()

    def bshd(x):
        return x.transpose(1, 2) if case["layout"] == "bhsd" else x

    loc = [local(x).requires_grad_(case["grad"]) for x in (q, k, v)]
    COUNTERS.reset()
    with torch.set_grad_enabled(case["grad"]):
        out, _ = token_ring_attn(*loc, causal=case["causal"], split=split, layout=case["layout"],
                                 window_size=case["window"])  # fmt: skip
    fwd = COUNTERS.kernel_calls
    errs = {"out": max_err(bshd(out), shard(refs[0], split=split))}
    if case["grad"]:
        out.backward(local(do))
        for name, x, ref in zip(("dq", "dk", "dv"), loc, refs[1:], strict=True):
            errs[name] = max_err(bshd(x.grad), shard(ref, split=split))
    kernels = (fwd, COUNTERS.kernel_calls - fwd)
    return {"errs": errs, "dtype_ok": out.dtype == dtype, "kernels": kernels}


def _compiled(rank, n, torch):
    """A small function calling token_ring_attn with a window, compiled fullgraph (aot_eager:
    the operator's fake implementation and AOTAutograd's backward): max |compiled - eager| and
    |compiled - exact| of out, dq, dk, dv, frames compiled and whether the ring is one node of
    the graph."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from tokenring_xdit import make_split, shard, token_ring_attn

    case, total = _case("compiled", (3, 0), h=4, h_kv=2), 8 * n
    split = make_split(total, n, causal=True)

    def fn(q, k, v):
        out, _ = token_ring_attn(q, k, v, causal=True, split=split, window_size=case["window"])
        return out * 1.5  # traced work around the ring, in the same graph

    gen = torch.Generator().manual_seed(77)
    full = [torch.randn(1, total, h, 8, generator=gen) for h in (4, 2, 2, 4)]
    exact = [1.5 * shard(x, split=split) for x in _reference(case, total, *full, torch)]
    q, k, v, do = (shard(x, split=split) for x in full)

    def run(f):
        xs = [x.clone().requires_grad_() for x in (q, k, v)]
        out = f(*xs)
        out.backward(do)
        return [out.detach(), *(x.grad for x in xs)]

    cnt = CompileCounterWithBackend("aot_eager")
    compiled = run(torch.compile(fn, fullgraph=True, backend=cnt))
    ops = {str(node.target) for g in cnt.graphs for node in g.graph.nodes}
    eager = run(fn)
    return dict(vs_eager=max(max_err(a, b) for a, b in zip(compiled, eager, strict=True)),
                vs_exact=max(max_err(a, b) for a, b in zip(compiled, exact, strict=True)),
                frames=cnt.frame_count, op_in_graph="tokenring.attn" in ops)  # fmt: skip


def _rejections(rank, torch):
    """Calls refused on every rank: window_size that differs between ranks, a bad window on one
    rank (negative, floats), softcap or dropout with a window (token_ring_attn_func) and K/V
    travel with a window over K/V of another length than the queries'."""
    import tokenring_xdit as tr

    split = tr.make_split(16, 2, causal=True)
    qkv = [torch.randn(1, 8, 2, 8, requires_grad=True) for _ in range(3)]
    short = [torch.randn(1, 6, 2, 8, requires_grad=True) for _ in range(2)]  # K/V of 6 tokens
    first = rank == 0  # rank 0 asks a good window, rank 1 another or a bad one
    mine = {"differs": (3, 0) if first else (4, 0), "negative": (2, 0) if first else (-2, 0),
            "floats": (2, 0) if first else (2.0, 0)}  # fmt: skip
    calls = {
        **{name: lambda w=w: tr.token_ring_attn(*qkv, causal=True, split=split, window_size=w)
           for name, w in mine.items()},
        "softcap": lambda: tr.token_ring_attn_func(*qkv, window_size=(2, 2), softcap=5.0),
        "dropout": lambda: tr.token_ring_attn_func(*qkv, window_size=(2, 2), dropout_p=0.1),
        "travel-kv": lambda: tr.token_ring_attn(qkv[0], *short, window_size=(2, 2),
                                                travel="kv"),
    }  # fmt: skip
    found = {}
    for name, call in calls.items():
        try:
            call()
            found[name] = None
        except (ValueError, NotImplementedError) as e:
            found[name] = f"{type(e).__name__}: {e}"
    return found


def _worker(rank, n, cases):
    import torch
    import torch.distributed as dist

    from tokenring_xdit.ring.comm import setup_token_ring_group

    setup_token_ring_group(dist.group.WORLD)
    result = {"cases": {c["name"]: _run_case(c, rank, n, torch) for c in cases}}
    if n == 2:
        result["compiled"] = _compiled(rank, n, torch)
        result["rejections"] = _rejections(rank, torch)
    return result


@functools.cache
def _launch(n):
    return values(run_ranks(_worker, n, CASES, timeout=300))


def _planned_kernels(case, n):
    """Kernels each rank runs per pass, from the window plan of the case's split."""
    from tokenring_xdit.ring.packed.window_plan import window_plan
    from tokenring_xdit.ring.schedules.window import Window

    split, lens = _split(case, n), (case["local"],) * n
    plan = window_plan(Window.of(case["window"], case["causal"]), case["causal"], lens,
                       split.layout(case["causal"], n), split.docs)  # fmt: skip
    return [sum(bool(st.kernel) and plan.block(r, st.step) != () for st in plan.steps[r])
            for r in range(n)]  # fmt: skip


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_windowed_calls_match_exact_attention(n):
    failures = case_failures(n, _launch(n), CASES, FP32_TOL, BF16_TOL)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_each_rank_runs_the_kernels_the_window_plan_names(n):
    """Forward and backward run the plan's blocks on every rank, nothing more (no-grad: the
    forward's only)."""
    for case in CASES:
        planned = _planned_kernels(case, n)
        for rank, res in enumerate(_launch(n)):
            want = (planned[rank], planned[rank] if case["grad"] else 0)
            got = res["cases"][case["name"]]["kernels"]
            assert got == want, (n, rank, case["name"], got, want)


def test_a_narrow_window_skips_blocks_at_ring_4():
    """Ring 4, zigzag, a window inside a chunk: 10 of the 16 blocks (the diagonals and the
    neighbouring chunks), as the window plan says."""
    from tokenring_xdit.ring.packed.window_traffic import window_traffic

    case = next(c for c in CASES if c["name"] == NARROW)
    predicted = window_traffic(4, case["local"], case["window"], causal=True)["kernels"]
    for pass_ in (0, 1):
        counted = [res["cases"][NARROW]["kernels"][pass_] for res in _launch(4)]
        assert sum(counted) == predicted == 10, (pass_, counted, predicted)


def test_windowed_call_compiles_fullgraph_and_matches_eager():
    for rank, res in enumerate(_launch(2)):
        got = res["compiled"]
        assert got["vs_eager"] <= FP32_TOL and got["vs_exact"] <= FP32_TOL, (rank, got)
        assert got["frames"] == 1 and got["op_in_graph"], (rank, got)


def test_bad_window_is_one_error_on_every_rank():
    needles = {
        "differs": "window_size differs across ring ranks: rank 0 has (3, 0), rank 1 has (4, 0)",
        "negative": "window_size must be (left, right) with each >= 0 or -1",
        "floats": "window_size must be a pair of ints",
        "softcap": "softcap=5.0",
        "dropout": "dropout_p=0.1",
        "travel-kv": "a sliding window only over K/V of the queries' length",
    }
    for rank, res in enumerate(_launch(2)):
        for name, needle in needles.items():
            got = res["rejections"][name]
            assert got is not None and needle in got, (rank, name, got)
