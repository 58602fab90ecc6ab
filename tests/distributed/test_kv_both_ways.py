"""The K/V family (K/V halves both ways round the ring) on real gloo ranks: forward AND backward
against autograd of exact float64 attention over the whole sequence, ring 1-4, causal (zigzag)
and non-causal with uneven lengths, MHA, GQA and MQA, both layouts, packed documents (within
documents, only the blocks that share one run); and every transfer of one
forward and one backward, per step and lane, against the table (ring/schedules/kv_both_ways.py).

One launch per ring size runs the whole case matrix (CI has 2 cores); tests assert on the cached
results.
"""

from __future__ import annotations

import functools
import itertools

import pytest

from tests.harness import run_ranks, values
from tests.reference import case_failures, exact_grads, max_err

WORLD_SIZES = [1, 2, 3, 4]
FP32_TOL = 2e-5
# bf16 inputs, fp64 reference on the same (rounded) inputs; grads are O(1) here
BF16_TOL = {"out": 2e-2, "dq": 6e-2, "dk": 6e-2, "dv": 6e-2}


def _case(name, *, causal, h=4, h_kv=4, b=1, d=16, layout="bshd", dtype="float32", lens=6,
          kv_lens=None, kernel="auto", seed=0):  # fmt: skip
    """lens: causal: the zigzag chunk length (local = 2 x chunk); non-causal: local q lengths."""
    return dict(name=name, causal=causal, h=h, h_kv=h_kv, b=b, d=d, layout=layout, dtype=dtype,
                lens=lens, kv_lens=kv_lens, kernel=kernel, seed=seed)  # fmt: skip


CASES = [
    _case("causal-mha-heads-bshd", causal=True, seed=1),
    _case(
        "causal-gqa42-heads-bhsd-b2-odd",
        causal=True,
        h_kv=2,
        b=2,
        d=8,
        layout="bhsd",
        lens=5,
        seed=2,
    ),  # fmt: skip
    _case("causal-mqa41-tokens-bshd", causal=True, h_kv=1, lens=5, kernel="math", seed=3),
    _case("causal-mha33-tokens-bshd", causal=True, h=3, h_kv=3, lens=4, seed=4),
    _case(
        "noncausal-gqa42-uneven",
        causal=False,
        h_kv=2,
        b=2,
        lens=[5, 7, 3, 6],
        kv_lens=[8, 4, 6, 5],
        seed=5,
    ),  # fmt: skip
    _case(
        "noncausal-mqa41-uneven-bhsd",
        causal=False,
        h_kv=1,
        layout="bhsd",
        lens=[4, 6, 5, 3],
        kv_lens=[7, 3, 6, 2],
        kernel="math",
        seed=6,
    ),  # fmt: skip
    _case("noncausal-mha-bhsd", causal=False, h=2, h_kv=2, d=24, layout="bhsd", seed=7),
    _case("bf16-causal-gqa42", causal=True, h_kv=2, b=2, dtype="bfloat16", lens=8, seed=8),
    _case(
        "bf16-noncausal-mqa41", causal=False, h_kv=1, dtype="bfloat16", lens=[6, 5, 7, 4], seed=9
    ),  # fmt: skip
]


def _packed(name, *, causal, docs, h=4, h_kv=4, layout="bshd", lens=6, kernel="auto", seed=0,
            ids=False):  # fmt: skip
    """A packed-documents case: `docs`, document lengths repeated over the row (the last one
    cut where the row ends); batch 1, K/V the query's tokens. `ids`: the documents are given as
    position ids (transformers' packed batches) instead of cu_seqlens."""
    return {**_case(name, causal=causal, h=h, h_kv=h_kv, layout=layout, lens=lens, kernel=kernel,
                    seed=seed), "docs": docs, "ids": ids}  # fmt: skip


# documents crossing zigzag chunks and ranks, 1-token ones; halves by heads (GQA) and by tokens
PACKED = [
    _packed("packed-causal-mha-heads", causal=True, docs=[1, 7, 3, 9], lens=5, seed=11),
    _packed(
        "packed-causal-gqa42-heads-bhsd",
        causal=True,
        h_kv=2,
        layout="bhsd",
        docs=[4, 1, 13, 2],
        lens=6,
        seed=12,
    ),  # fmt: skip
    _packed(
        "packed-causal-mqa41-tokens",
        causal=True,
        h_kv=1,
        docs=[2, 11, 1, 5],
        lens=6,
        kernel="math",
        seed=13,
    ),  # fmt: skip
    _packed(
        "packed-causal-mha33-tokens", causal=True, h=3, h_kv=3, docs=[9, 1, 1, 6], lens=4, seed=14
    ),  # fmt: skip
    _packed(
        "packed-noncausal-gqa42-uneven",
        causal=False,
        h_kv=2,
        docs=[1, 6, 4, 10],
        lens=[5, 7, 3, 6],
        seed=15,
    ),  # fmt: skip
    _packed(
        "packed-noncausal-mqa41-tokens-bhsd",
        causal=False,
        h_kv=1,
        layout="bhsd",
        docs=[3, 1, 8],
        lens=[4, 6, 5, 3],
        seed=16,
    ),  # fmt: skip
    _packed(
        "packed-causal-gqa42-ids", causal=True, h_kv=2, docs=[3, 9, 1, 4], lens=4, seed=17, ids=True
    ),  # fmt: skip
    _packed(
        "packed-noncausal-mha-ids",
        causal=False,
        h=2,
        h_kv=2,
        docs=[5, 1, 9],
        lens=[6, 4, 7, 5],
        seed=18,
        ids=True,
    ),  # fmt: skip
]


def _windowed(name, window, *, causal, docs=None, h=4, h_kv=2, layout="bshd", lens=6, seed=0):
    """A sliding-window case (`window`: flash-attn's (left, right)); `docs` as `_packed`'s.
    Non-causal: every rank holds `lens` tokens (a window needs K/V of the queries' length)."""
    case = _case(name, causal=causal, h=h, h_kv=h_kv, layout=layout, lens=lens, seed=seed)
    return {**case, "window": window, **({"docs": docs, "ids": False} if docs else {})}


# local: 12 (causal: chunks of 6) or 6 tokens; windows inside a shard, over several shards, past
# the sequence; halves by heads (GQA 4/2) and by tokens (3/3, 4/1)
WINDOWED = [
    _windowed("win-causal-gqa42-inside-chunk", (2, 0), causal=True, seed=21),
    _windowed("win-causal-mha33-tokens-over-shards", (13, 0), causal=True, h=3, h_kv=3,
              lens=4, layout="bhsd", seed=22),
    _windowed("win-noncausal-gqa42-band", (3, 2), causal=False, seed=23),
    _windowed("win-noncausal-mqa41-tokens-over-shards", (-1, 8), causal=False, h_kv=1, seed=24),
    _windowed("win-causal-gqa42-past-sequence", (100, 0), causal=True, lens=3, seed=25),
    _windowed("win-packed-causal-gqa42", (4, 0), causal=True, docs=[5, 9, 2], seed=26),
    _windowed("win-packed-noncausal-mha33-tokens", (2, 3), causal=False, h=3, h_kv=3,
              docs=[4, 1, 10], seed=27),
]  # fmt: skip
NARROW_W3 = "win-causal-gqa42-inside-chunk"  # ring 4, W = 3: against the whole table
COMPILED_WINDOW = (3, 0)


def _bounds(case, total: int) -> list[int]:
    """The case's cu_seqlens over a row of `total` tokens."""
    bounds, i = [0], 0
    while bounds[-1] < total:
        bounds.append(min(total, bounds[-1] + case["docs"][i % len(case["docs"])]))
        i += 1
    return bounds


def _positions(case, n):
    """Each rank's global query and K/V positions (causal: zigzag chunks r and 2N-1-r)."""
    if case["causal"]:
        c = case["lens"]
        pos = [list(range(r * c, (r + 1) * c)) + list(range((2 * n - 1 - r) * c, (2 * n - r) * c))
               for r in range(n)]  # fmt: skip
        return pos, pos
    q_lens = case["lens"] if isinstance(case["lens"], list) else [case["lens"]] * 4
    kv_lens = case["kv_lens"] or q_lens

    def runs(lens):
        starts = [sum(lens[:r]) for r in range(n)]
        return [list(range(starts[r], starts[r] + lens[r])) for r in range(n)]

    return runs(q_lens[:n]), runs(kv_lens[:n])


def _inputs(case, n, torch):
    """Global (b, h, S, d) q, k, v, dO in the case's dtype, and the positions."""
    q_pos, kv_pos = _positions(case, n)
    s_q, s_kv = max(map(max, q_pos)) + 1, max(map(max, kv_pos)) + 1
    gen = torch.Generator().manual_seed(900 + case["seed"])
    b, h, h_kv, d = case["b"], case["h"], case["h_kv"], case["d"]
    dtype = getattr(torch, case["dtype"])
    shapes = ((b, h, s_q, d), (b, h_kv, s_kv, d), (b, h_kv, s_kv, d), (b, h, s_q, d))
    xs = [torch.randn(*s, generator=gen, dtype=torch.float64).to(dtype) for s in shapes]
    return xs, q_pos, kv_pos


def _local(case, torch, x, pos, rank):
    x = x[:, :, pos[rank]]
    return (x.transpose(1, 2) if case["layout"] == "bshd" else x).contiguous()


def _run_case(case, rank, n, torch):
    """Max |err| of out, dq, dk, dv on this rank through the public call (travel="kv"), with
    autograd; causal calls prove their zigzag shards by their positions."""
    from tokenring_xdit import token_ring_attn
    from tokenring_xdit.ring.comm import COUNTERS

    (q, k, v, do), q_pos, kv_pos = _inputs(case, n, torch)
    bounds = _bounds(case, q.shape[2]) if "docs" in case else None
    window = case.get("window", (-1, -1))
    ref, *grads = _reference(torch, (q, k, v, do), case["causal"], bounds, window)
    loc = [_local(case, torch, x, p, rank).requires_grad_()
           for x, p in ((q, q_pos), (k, kv_pos), (v, kv_pos))]  # fmt: skip
    COUNTERS.reset()
    positions = torch.tensor(q_pos[rank]) if case["causal"] else None
    docs = {"cu_seqlens": bounds}
    if case.get("ids"):  # each token's place in its document
        docs = {"position_ids": torch.tensor([p - max(b for b in bounds if b <= p)
                                              for p in q_pos[rank]])}  # fmt: skip
    out, _ = token_ring_attn(*loc, causal=case["causal"], layout=case["layout"],
                             kernel=case["kernel"], positions=positions, travel="kv",
                             window_size=window, **docs)  # fmt: skip
    kernels_fwd = COUNTERS.kernel_calls
    out.backward(_local(case, torch, do, q_pos, rank))
    errs = {"out": max_err(out, _local(case, torch, ref, q_pos, rank))}
    for name, x, g, p in zip(("dq", "dk", "dv"), loc, grads, (q_pos, kv_pos, kv_pos),
                             strict=True):  # fmt: skip
        errs[name] = max_err(x.grad, _local(case, torch, g, p, rank))
    kernels = (kernels_fwd, COUNTERS.kernel_calls - kernels_fwd)
    return {"errs": errs, "dtype_ok": out.dtype == q.dtype, "kernels": kernels,
            "planned": _planned(case, n, rank, bounds, tuple(map(len, q_pos)))}  # fmt: skip


def _reference(torch, xs, causal: bool, bounds, window=(-1, -1)):
    """(out, dq, dk, dv) of exact float64 attention over the whole row, (b, h, s, d): within
    documents where `bounds` and under a sliding `window` (the mask: tests/window_ring.py),
    else plain."""
    xs = [x.double() for x in xs]
    if bounds is None and window == (-1, -1):
        return exact_grads(*xs, causal=causal, layout="bhsd")
    from tests.window_ring import window_mask

    q, k, v = (x.detach().requires_grad_() for x in xs[:3])
    g = q.shape[1] // k.shape[1]
    kx, vx = (x.repeat_interleave(g, dim=1) for x in (k, v))
    keep = window_mask(q.shape[2], window, causal, bounds)
    scores = (q @ kx.transpose(-1, -2)) * q.shape[-1] ** -0.5
    out = scores.masked_fill(~keep, float("-inf")).softmax(-1).nan_to_num(0.0) @ vx
    out.backward(xs[3])
    return out.detach(), q.grad, k.grad, v.grad


def _plan(case, q_lens):
    """The case's plan (packed documents, a window), or None: the whole table."""
    from tokenring_xdit.ring.packed import Documents
    from tokenring_xdit.ring.packed.kv_plan import kv_plan
    from tokenring_xdit.ring.schedules.kv_both_ways import split_by_heads
    from tokenring_xdit.ring.schedules.window import Window

    window = Window.of(case.get("window"), case["causal"])
    if "docs" not in case and window is None:
        return None
    docs = Documents.of(_bounds(case, sum(q_lens))) if "docs" in case else None
    return kv_plan(docs, tuple(q_lens), case["causal"], split_by_heads(case["h_kv"]), window)


def _planned(case, n, rank, bounds, q_lens):
    """Kernels the plan runs per pass on this rank (the table's 2N-1 without one)."""
    plan = _plan(case, q_lens)
    return 2 * n - 1 if plan is None else plan.kernel_calls(rank)


class _RecordingLane:
    """A real lane that also writes down every post: (lane, step, sends, receives), each a list
    of (peer, elements, dtype)."""

    def __init__(self, lane, index: int, log: list):
        self._lane, self._index, self._log = lane, index, log

    @property
    def step(self):
        return self._lane.step

    @step.setter
    def step(self, value):
        self._lane.step = value

    def post(self, sends, recvs, what):
        def seen(ops):
            return [(p, t.numel(), str(t.dtype)) for t, p in ops]

        self._log.append((self._index, self._lane.step, seen(sends), seen(recvs)))
        return self._lane.post(sends, recvs, what)

    def wait(self, works=None):
        self._lane.wait(works)


class _RecordingRing:
    def __init__(self, ring, log):
        self.rank, self.size, self._ring, self._log = ring.rank, ring.size, ring, log

    def lanes(self):
        return tuple(_RecordingLane(x, i, self._log) for i, x in enumerate(self._ring.lanes()))


def _traffic(case, rank, n, torch):
    """Every post of one forward and one backward on this rank (real gloo transfers)."""
    import torch.distributed as dist

    from tokenring_xdit.ring.agreed_ring import Ring
    from tokenring_xdit.ring.comm import RingPosition, comms_of
    from tokenring_xdit.ring.kernels import MATH, window_pair
    from tokenring_xdit.ring.kernels.registry import DOC_REGISTRY
    from tokenring_xdit.ring.kernels.wrappers import expanded
    from tokenring_xdit.ring.schedules.kv_both_ways import split_by_heads
    from tokenring_xdit.ring.tensor_layout import get_layout
    from tokenring_xdit.ring.training.kv_backward import kv_backward
    from tokenring_xdit.ring.training.kv_forward import kv_forward
    from tokenring_xdit.ring.training.kv_halves import KvCall

    (q, k, v, do), q_pos, kv_pos = _inputs(case, n, torch)
    q, do = (_local(case, torch, x, q_pos, rank) for x in (q, do))
    k, v = (_local(case, torch, x, kv_pos, rank) for x in (k, v))
    layout = get_layout(case["layout"])
    pos = RingPosition.of(dist.group.WORLD)
    ring = Ring(pos=pos, comms=comms_of(pos.group), q_lens=tuple(map(len, q_pos)), settings=())
    kv_lens = tuple(map(len, kv_pos))
    by_heads = split_by_heads(case["h_kv"])
    plan, pair = _plan(case, kv_lens), MATH
    if plan is not None:  # packed, windowed: the masked kernel takes segments and bands
        pair = window_pair(DOC_REGISTRY["masked"], q.device, q.dtype, case["d"], case["d"])
    call = KvCall(expanded(pair), layout, case["d"] ** -0.5, case["causal"], by_heads, plan=plan)
    fwd, bwd = [], []
    out, lse = kv_forward(call, _RecordingRing(ring, fwd), kv_lens, q, k, v)
    kv_backward(call, _RecordingRing(ring, bwd), kv_lens, do, q, k, v, out, lse)
    return {"fwd": fwd, "bwd": bwd}


def _worker(rank, n, cases):
    import torch
    import torch.distributed as dist

    from tokenring_xdit.ring.comm import setup_token_ring_group

    setup_token_ring_group(dist.group.WORLD)
    result = {"cases": {c["name"]: _run_case(c, rank, n, torch) for c in cases}}
    if n > 1:
        result["traffic"] = {c["name"]: _traffic(c, rank, n, torch) for c in cases}
    if n == 2:
        result["rejections"] = _rejections(rank, torch)
        result["compiled"] = _compiled(rank, n, torch)
        result["compiled_window"] = _compiled(rank, n, torch, COMPILED_WINDOW)
    return result


def _compiled(rank, n, torch, window=(-1, -1)):
    """One causal GQA call with travel="kv" (and `window`) under torch.compile (fullgraph,
    aot_eager) against the same call eager: out and gradients, and the K/V family's kernel
    count in each pass."""
    from tokenring_xdit import token_ring_attn
    from tokenring_xdit.ring.comm import COUNTERS

    case = next(c for c in CASES if c["name"] == "causal-gqa42-heads-bhsd-b2-odd")
    (q, k, v, do), q_pos, kv_pos = _inputs(case, n, torch)
    positions = torch.tensor(q_pos[rank])

    def fn(q, k, v):
        out, _ = token_ring_attn(q, k, v, causal=True, layout="bhsd", positions=positions,
                                 travel="kv", window_size=window)  # fmt: skip
        return out * 1.5

    got = {}
    for name, run in (("eager", fn), ("compiled", torch.compile(fn, fullgraph=True,
                                                                backend="aot_eager"))):  # fmt: skip
        loc = [_local(case, torch, x, p, rank).requires_grad_()
               for x, p in ((q, q_pos), (k, kv_pos), (v, kv_pos))]  # fmt: skip
        COUNTERS.reset()
        out = run(*loc)
        fwd = COUNTERS.kernel_calls
        out.backward(_local(case, torch, do, q_pos, rank))
        got[name] = ([out.detach(), *(x.grad for x in loc)], (fwd, COUNTERS.kernel_calls - fwd))
    diff = max(float((a - b).abs().max()) for a, b in zip(got["eager"][0], got["compiled"][0],
                                                          strict=True))  # fmt: skip
    return {"diff": diff, "kernels": {k: x[1] for k, x in got.items()}}


def _rejections(rank, torch):
    """Calls refused on every rank: K/V heads that do not divide the query heads on one rank,
    head counts that differ between ranks, a causal call on unequal shards, `travel` that
    differs between ranks (an agreed option, named), packed documents forced onto K/V in the
    layouts it does not run (contiguous causal shards, the documents layout), and a travel that
    does not exist."""
    from tokenring_xdit import token_ring_attn

    def qkv(s=8, h=4, h_kv=2):
        xs = (torch.randn(1, s, h, 16), torch.randn(1, s, h_kv, 16), torch.randn(1, s, h_kv, 16))
        return [x.requires_grad_() for x in xs]

    from tokenring_xdit import make_split

    zigzag = torch.tensor([0, 1, 2, 3, 12, 13, 14, 15] if rank == 0 else [4, 5, 6, 9, 10, 11])
    cut = {x: make_split(16, 2, causal=True, cu_seqlens=[0, 8, 16], layout=x)
           for x in ("contiguous", "documents")}  # fmt: skip
    calls = {
        "gqa": dict(args=qkv(h_kv=3 if rank == 0 else 2)),
        "heads": dict(args=qkv(h=4 if rank == 0 else 8)),
        "zigzag": dict(args=qkv(s=8 if rank == 0 else 6), causal=True, positions=zigzag),
        "travel": dict(args=qkv(), travel="kv" if rank == 0 else "q"),
        "packed-contiguous": dict(args=qkv(), causal=True, split=cut["contiguous"]),
        "packed-documents": dict(args=qkv(), causal=True, split=cut["documents"]),
        "bogus": dict(args=qkv(), travel="k"),
        "window-kv-length": dict(args=[qkv()[0], *qkv(s=6)[1:]], window_size=(2, 2)),
    }
    found = {}
    for name, call in calls.items():
        kwargs = {"travel": "kv", **{k: x for k, x in call.items() if k != "args"}}
        try:
            token_ring_attn(*call["args"], **kwargs)
            found[name] = None
        except (ValueError, NotImplementedError) as e:
            found[name] = str(e)
    return found


@functools.cache
def _launch(n):
    return values(run_ranks(_worker, n, CASES + PACKED + WINDOWED, timeout=300))


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_forward_and_gradients_match_exact_attention(n):
    failures = case_failures(n, _launch(n), CASES, FP32_TOL, BF16_TOL)
    assert not failures, "\n".join(failures)
    for rank, res in enumerate(_launch(n)):  # the diagonal, then one block per half and step
        for case in CASES:
            got = res["cases"][case["name"]]["kernels"]
            assert got == (2 * n - 1, 2 * n - 1), (n, rank, case["name"], got)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_packed_documents_match_exact_masked_attention(n):
    """Packed rows (fp32) against exact float64 attention within documents; every pass runs
    the diagonal and the plan's blocks that hold a segment, nothing else."""
    failures = case_failures(n, _launch(n), PACKED, FP32_TOL, BF16_TOL)
    assert not failures, "\n".join(failures)
    for rank, res in enumerate(_launch(n)):
        for case in PACKED:
            got = res["cases"][case["name"]]
            assert got["kernels"] == (got["planned"],) * 2, (n, rank, case["name"], got)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_sliding_windows_match_exact_windowed_attention(n):
    """Windows (dense and packed, causal zigzag and not, head and token halves) against exact
    float64 attention under the window's mask; each pass runs the plan's blocks, no more."""
    failures = case_failures(n, _launch(n), WINDOWED, FP32_TOL, BF16_TOL)
    assert not failures, "\n".join(failures)
    worst = max(e for res in _launch(n) for c in WINDOWED
                for e in res["cases"][c["name"]]["errs"].values())  # fmt: skip
    print(f"ring {n}: windowed K/V family, max error {worst:.2e}")
    for rank, res in enumerate(_launch(n)):
        for case in WINDOWED:
            got = res["cases"][case["name"]]
            assert got["kernels"] == (got["planned"],) * 2, (n, rank, case["name"], got)


def _sent(posts) -> tuple[int, int]:
    """(messages, elements) a rank's posts send."""
    return sum(len(p[2]) for p in posts), sum(e for p in posts for _, e, _ in p[2])


def _total(per_rank) -> tuple[int, int]:
    return tuple(map(sum, zip(*per_rank, strict=True)))


def test_a_narrow_window_runs_and_sends_less_at_ring_4():
    """Ring 4, causal zigzag, W = 3 (inside a chunk): kernels and messages of both passes
    against the whole table (2N-1 kernels a pass a rank; every transfer)."""
    case = next(c for c in WINDOWED if c["name"] == NARROW_W3)
    whole = {**case, "window": (-1, -1)}
    kernels = sum(res["cases"][NARROW_W3]["kernels"][0] for res in _launch(4))
    got, full = {}, {}
    for pass_, backward in (("fwd", False), ("bwd", True)):
        got[pass_] = _total([_sent(res["traffic"][NARROW_W3][pass_]) for res in _launch(4)])
        full[pass_] = _total([_sent(_expected(whole, 4, r, backward)) for r in range(4)])
    print(
        f"ring 4, W=3: kernels {kernels} of {4 * 7} a pass; (messages, elements) sent: "
        f"forward {got['fwd']} of {full['fwd']}, backward {got['bwd']} of {full['bwd']}"
    )
    assert kernels < 4 * 7
    for pass_ in ("fwd", "bwd"):
        assert got[pass_][0] < full[pass_][0], (pass_, got, full)


def test_bad_input_is_one_error_on_every_rank():
    for rank, res in enumerate(_launch(2)):
        for name, needle in (("gqa", "divides q's"), ("heads", "head count differs"),
                             ("zigzag", "zigzag"),
                             ("travel", "travel differs across ring ranks: rank 0 has 'kv', "
                                        "rank 1 has 'q'"),
                             ("packed-contiguous", "does not run packed documents in the "
                                                   "'contiguous' layout"),
                             ("packed-documents", "does not run packed documents in the "
                                                  "'documents' layout"),
                             ("bogus", "travel must be one of"),
                             ("window-kv-length", "a sliding window only over K/V of the "
                                                  "queries' length")):  # fmt: skip
            got = res["rejections"][name]
            assert got is not None and needle in got, (rank, name, got)


def test_compiled_calls_equal_eager_ones():
    """travel="kv" under torch.compile (one ring operator) runs the K/V family like eager, with
    a window too (the plan's kernels in both)."""
    case = next(c for c in CASES if c["name"] == "causal-gqa42-heads-bhsd-b2-odd")
    windowed = {**case, "window": COMPILED_WINDOW}
    for rank, res in enumerate(_launch(2)):
        got = res["compiled"]
        assert got["diff"] <= 1e-6, (rank, got)
        assert got["kernels"] == {"eager": (3, 3), "compiled": (3, 3)}, (rank, got)
        got = res["compiled_window"]
        planned = (_plan(windowed, (2 * case["lens"],) * 2).kernel_calls(rank),) * 2
        assert got["diff"] <= 1e-6, (rank, got)
        assert got["kernels"] == {"eager": planned, "compiled": planned}, (rank, got, planned)


def _half_elements(case, length: int, half: int) -> int:
    """Elements of one travelling half of K (or V) whose owner holds `length` tokens."""
    from tokenring_xdit.ring.schedules.kv_both_ways import half_ranges, split_by_heads

    by_heads = split_by_heads(case["h_kv"])
    tokens = sum(b - a for a, b in half_ranges(length, case["causal"], by_heads)[half])
    heads = case["h_kv"] // 2 if by_heads else case["h_kv"]
    return case["b"] * tokens * heads * case["d"]


def _moves(case, n):
    """Every message of the table as the rule says (independent of `kept_steps`): (row, lane,
    kind, sender, receiver, owner). A half travels from holder to holder while a later holder
    runs a block with it (the plan's; every block without one); its dK/dV sum goes holder to
    holder within each run of steps with a block, one row behind, and home from the run's last
    holder."""
    plan = _plan(case, [len(p) for p in _positions(case, n)[1]])
    moves = []
    for owner, (h, ahead) in itertools.product(range(n), ((0, 1), (1, -1))):
        holder = [(owner + ahead * s) % n for s in range(n + 1)]
        used = [s for s in range(1, n) if plan is None or plan.block(holder[s], s, h) != ()]
        last = max(used, default=0)
        moves += [(s, h, "kv", holder[s], holder[s + 1], owner) for s in range(last)]
        for s in used:
            later = s + 1 in used
            moves.append((s + 1, h, "sum" if later else "home", holder[s],
                          holder[s + 1] if later else owner, owner))  # fmt: skip
    return moves


def _expected(case, n, rank, backward: bool):
    """The posts this rank makes by `_moves`: (lane, step, sends, receives), K/V first, then
    the sum passed on (or home), receives in the same order (row N's home: as a sum)."""
    kv_lens = [len(p) for p in _positions(case, n)[1]]
    kv_dtype = f"torch.{case['dtype']}"
    travel = kv_dtype if n == 2 else "torch.float32"
    moves = _moves(case, n)
    posts = []
    for step in range(n + (backward and n > 1)):
        for h in (0, 1):
            here = [m for m in moves if m[:2] == (step, h) and (backward or m[2] == "kv")]
            order = {"kv": 0, "sum": 1, "home": 1 if step == n else 2}
            here.sort(key=lambda m: order[m[2]])
            sends, recvs = [], []
            for _, _, kind, src, dst, owner in here:
                msg = _half_elements(case, kv_lens[owner], h), kv_dtype if kind == "kv" else travel
                if src == rank:
                    sends += [(dst, *msg)] * 2
                if dst == rank:
                    recvs += [(src, *msg)] * 2
            posts.append((h, step, [x for x in sends if x[1]], [x for x in recvs if x[1]]))
    return posts


def _normal(posts):
    return [(lane, step, [tuple(x) for x in sends], [tuple(x) for x in recvs])
            for lane, step, sends, recvs in posts]  # fmt: skip


@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_transfer_is_the_tables(n):
    """Per step and lane (= direction): peers, sizes and dtypes of every message, forward and
    backward, as the table says (packed rows too: their halves travel whole); no self-sends."""
    for rank, res in enumerate(_launch(n)):
        for case in CASES + PACKED + WINDOWED:
            got = res["traffic"][case["name"]]
            for pass_, backward in (("fwd", False), ("bwd", True)):
                have = _normal(got[pass_])
                assert have == _normal(_expected(case, n, rank, backward)), (n, rank, case["name"])
                assert all(p != rank for post in have for p, _, _ in post[2]), "self-send"


def test_each_direction_carries_half_the_kv_per_step():
    """Ring 4, causal GQA 4/2 (halves by heads): every forward step but the last sends
    b·L·Hkv·d elements (K and V halves together) on each lane: one lane to r+1, one to r-1."""
    case = next(c for c in CASES if c["name"] == "causal-gqa42-heads-bhsd-b2-odd")
    per_step = case["b"] * 2 * case["lens"] * case["h_kv"] * case["d"]
    for rank, res in enumerate(_launch(4)):
        for lane, step, sends, _ in res["traffic"][case["name"]]["fwd"]:
            if step == 3:
                assert not sends
                continue
            assert {p for p, _, _ in sends} == {(rank + 1) % 4 if lane == 0 else (rank - 1) % 4}
            assert sum(e for _, e, _ in sends) == per_step, (rank, lane, step, sends)
