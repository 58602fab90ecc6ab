"""Drift guard: eager and compiled TokenRing calls are prepared the same way (ring/seam/prepare.py).

For every call option (the split the shards were cut by, with its documents or beside them as
cu_seqlens or position ids, in the zigzag, documents and contiguous layouts, timeout, kernel name,
layouts including the swapped-storage wire layout, GQA, causal, deterministic, joint K/V, final
pieces, scale) one ring of 2 gloo ranks runs the call eagerly and under
torch.compile(fullgraph=True), recording what `prepare` hands to `agree`: the header every rank
sends (header.call_header), the call's deadline and kernel family, and the agreed ring (key,
documents, transport). Both must be equal, and so must the results (out and dq/dk/dv). Options
the eager path refuses are refused compiled with the same error. Packed documents under compile
have no graph break, with fullgraph=True and the default; a tiny Llama trained on packed batches
(shard_batch(position_ids=)) compiled equals eager.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest

from tests.harness import run_ranks, tiny_llama_config, values

# aot_eager runs the same kernels as eager: only the graph around the ring differs, and a
# compiled function that returns lse hands the ring's backward a zero lse gradient (eager: None),
# folded into the O stand-in (the same delta up to fp32 rounding: 1.01e-6 seen)
TOL = 2e-6
H, HK, D, S = 4, 2, 8, 8  # heads, K/V heads (GQA), head size, local length (zigzag: 2 x 4)


def _cases(torch, n):
    """(name, options, train, kv_heads, causal sharding, tensor form) for every option."""
    from tokenring_xdit.config import RingConfig

    total = S * n
    ids = torch.cat([torch.arange(5), torch.arange(total - 5)])  # two documents
    return [
        ("plain-infer", {}, False, H, False, "bshd"),
        ("plain-train", {}, True, H, False, "bshd"),
        ("causal-train", {"causal": True}, True, H, True, "bshd"),
        ("causal-infer", {"causal": True}, False, H, True, "bshd"),
        ("gqa-train", {}, True, HK, False, "bshd"),
        ("gqa-infer", {}, False, HK, False, "bshd"),
        ("bhsd-infer", {"layout": "bhsd"}, False, H, False, "bhsd"),
        ("swapped-wire-infer", {"layout": "bhsd"}, False, H, False, "swapped"),
        ("bhsd-causal-train", {"layout": "bhsd", "causal": True}, True, H, True, "bhsd"),
        ("kernel-math-train", {"kernel": "math"}, True, H, False, "bshd"),
        ("kernel-math-infer", {"kernel": "math"}, False, H, False, "bshd"),
        ("deterministic-train", {"deterministic": True, "causal": True}, True, H, True, "bshd"),
        ("timeout-infer", {"config": RingConfig(timeout=60.0)}, False, H, False, "bshd"),
        ("timeout-train", {"config": RingConfig(timeout=60.0)}, True, H, False, "bshd"),
        ("chunks-scale-infer", {"final_chunks": 2, "softmax_scale": 0.3}, False, H, False, "bshd"),
        ("cu-seqlens-train", {"cu_seqlens": [0, 5, total]}, True, H, False, "bshd"),
        ("cu-seqlens-causal-train", {"cu_seqlens": [0, 5, total], "causal": True}, True, H, True,
         "bshd"),
        ("cu-tensor-infer", {"cu_seqlens": torch.tensor([0, 3, 9, total])}, False, H, False,
         "bshd"),
        ("position-ids-causal-train", {"position_ids": ids, "causal": True}, True, H, True, "bshd"),
        ("position-ids-infer", {"position_ids": ids}, False, H, False, "bshd"),
        ("documents-causal-train", {"cu_seqlens": [0, 5, total], "causal": True}, True, HK, True,
         "documents"),
        ("documents-split-infer", {"split": "bare", "cu_seqlens": torch.tensor([0, 5, total])},
         False, H, False, "documents"),
        ("contiguous-causal-train", {"cu_seqlens": [0, 5, total], "causal": True}, True, HK, True,
         "contiguous"),
        ("contiguous-split-infer", {"causal": True}, False, H, True, "contiguous"),
        ("joint-infer", {"joint": "rear"}, False, H, False, "bshd"),
        ("joint-front-infer", {"joint": "front"}, False, H, False, "bshd"),
    ]  # fmt: skip


# options the eager path refuses: refused compiled with the same error
REFUSED = [
    ("joint-train", {"joint": "rear"}, True),
    ("bad-strategy", {"joint": "middle"}, False),
    ("bad-kernel", {"kernel": "no_such_kernel"}, False),
    ("bad-cu-seqlens", {"cu_seqlens": [0, 4]}, True),
    ("bad-split", {"causal": True, "split": "other ring"}, True),
    ("bad-chunks", {"final_chunks": 0}, False),
]


def _recorder():
    """Wrap call.agree: every prepared call's header and agreed ring, in call order."""
    from tokenring_xdit.ring.agree.header import call_header
    from tokenring_xdit.ring.agree.problems import Problem
    from tokenring_xdit.ring.seam import prepare as call_mod

    records, agree = [], call_mod.agree

    def recording(spec, pos, **kwargs):
        header = dataclasses.astuple(call_header(spec, Problem(spec.problem)))
        ring = agree(spec, pos, **kwargs)
        docs = None if ring.plan is None else ring.plan.packing[1].bounds
        records.append((header, spec.timeout, spec.family, ring.key, docs, ring.transport))
        return ring

    call_mod.agree = recording
    return records


LAYOUT_FORMS = ("documents", "contiguous")  # shards cut in a packed row's layout


def _inputs(torch, rank, n, seed, kv_heads, causal, form):
    """This rank's q, k, v, dO and the split they were cut by."""
    from tokenring_xdit import make_split, shard

    gen = torch.Generator().manual_seed(seed)
    full = [torch.randn(1, S * n, h, D, generator=gen) for h in (H, kv_heads, kv_heads, H)]
    cut = {"cu_seqlens": [0, 5, S * n], "layout": form} if form in LAYOUT_FORMS else {}
    split = make_split(S * n, n, causal=causal, **cut)
    mine = [shard(x, split=split) for x in full]
    if form == "bhsd":
        return [x.transpose(1, 2).contiguous() for x in mine], split
    if form == "swapped":  # (b, h, s, d) views of (b, s, h, d) storage: the wire layout vote
        return [x.transpose(1, 2) for x in mine], split
    return mine, split


def _with_split(options: dict, split, form: str, n: int) -> dict:
    """The case's options with the split its shards were cut by: passed where the call is
    causal or in a packed layout ("bare": without its documents, which the call brings;
    "other ring": a split of another ring size)."""
    from dataclasses import replace

    from tokenring_xdit import make_split

    asked = options.get("split")
    if asked == "other ring":
        return {**options, "split": make_split(S * (n + 1), n + 1, causal=True)}
    if asked is None and not options.get("causal") and form not in LAYOUT_FORMS:
        return options
    return {**options, "split": replace(split, docs=None) if asked == "bare" else split}


def _call(torch, options: dict):
    from tokenring_xdit.ring.api import token_ring_attn

    options = dict(options)
    joint = options.pop("joint", None)

    def fn(q, k, v):
        extra = {}
        if joint is not None:  # joint K/V: the first two tokens of k/v, in k's layout
            dim = 2 if options.get("layout") == "bhsd" else 1
            jk, jv = (x.narrow(dim, 0, 2) * 0.5 for x in (k, v))
            extra = {"joint_kv": (jk, jv), "joint_strategy": joint}
        out, lse = token_ring_attn(q, k, v, **options, **extra)
        return out * 1.5, lse

    return fn


def _run(torch, fn, xs, do, train):
    xs = [x.detach().clone().requires_grad_(train) for x in xs]
    if not train:
        with torch.no_grad():
            out, lse = fn(*xs)
        return [out, lse]
    out, lse = fn(*xs)
    out.backward(do)
    return [out.detach(), lse, *(x.grad for x in xs)]


def _error(torch, fn, xs, do, train):
    try:
        _run(torch, fn, xs, do, train)
    except Exception as exc:  # Dynamo may wrap what the traced code raised: name the cause
        cause = exc
        while cause.__cause__ is not None and type(cause).__name__ in ("TorchRuntimeError",):
            cause = cause.__cause__
        return f"{type(cause).__name__}: {str(cause).splitlines()[0]}"
    return "no error"


def _drift(rank, n):
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    from tokenring_xdit import shard

    torch._dynamo.config.cache_size_limit = 256
    results = {"default_compile": _default_compile(torch, rank, n)}  # first: a fresh process
    records = _recorder()
    for i, (name, options, train, kv_heads, causal, form) in enumerate(_cases(torch, n)):
        (q, k, v, do), split = _inputs(torch, rank, n, i, kv_heads, causal, form)
        options = _with_split(options, split, form, n)
        if "position_ids" in options:  # this rank's part of the packed position ids
            options = {**options, "position_ids": shard(options["position_ids"], split=split,
                                                        dim=-1)}  # fmt: skip
        fn = _call(torch, options)
        del records[:]
        eager = _run(torch, fn, (q, k, v), do, train)
        eager_rec = list(records)
        del records[:]
        compiled = _run(torch, torch.compile(fn, fullgraph=True, backend="aot_eager"),
                        (q, k, v), do, train)  # fmt: skip
        results[name] = dict(
            eager=eager_rec[:1],
            compiled=records[:1],
            diff=max(float((a - b).abs().max()) for a, b in zip(eager, compiled, strict=True)),
        )
    for name, options, train in REFUSED:
        (q, k, v, do), split = _inputs(torch, rank, n, 0, H, False, "bshd")
        fn = _call(torch, _with_split(options, split, "bshd", n))
        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
        results[name] = dict(
            eager=_error(torch, fn, (q, k, v), do, train),
            compiled=_error(torch, compiled, (q, k, v), do, train),
        )
    results["graph_breaks"] = sum(counters["graph_break"].values())
    results["llama"] = _packed_llama(torch)
    return results


def _default_compile(torch, rank, n):
    """Packed documents with the default torch.compile (graph breaks allowed, none taken) as a
    user's first call in a fresh process (no eager packed call before it): compiled = eager."""
    from torch._dynamo.utils import counters

    from tokenring_xdit import token_ring_attn_func

    before = sum(counters["graph_break"].values())
    (q, k, v, do), split = _inputs(torch, rank, n, 99, HK, True, "bshd")
    cu = torch.tensor([0, 1, 6, S * n], dtype=torch.int32)

    def fn(q, k, v):
        return token_ring_attn_func(q, k, v, causal=True, split=split, cu_seqlens=cu) * 2.0

    compiled_fn = torch.compile(fn, backend="aot_eager")
    compiled = _run(torch, lambda *xs: (compiled_fn(*xs), None), (q, k, v), do, True)
    eager = _run(torch, lambda *xs: (fn(*xs), None), (q, k, v), do, True)
    diff = max(
        float((a - b).abs().max()) for a, b in zip(eager, compiled, strict=True) if a is not None
    )
    return dict(diff=diff, breaks=sum(counters["graph_break"].values()) - before)


def _packed_llama(torch):
    """A tiny GQA Llama trained two steps on packed batches cut by shard_batch (position ids,
    then cu_seqlens), compiled fullgraph vs eager: losses and every gradient equal."""
    from transformers import AutoModelForCausalLM

    from tokenring_xdit.integrations import transformers as tr_hf

    tr_hf.register()
    cfg = tiny_llama_config(layers=1, use_cache=False)
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 64, (1, 24), generator=gen)
    pos = torch.cat([torch.arange(n) for n in (5, 1, 9, 3, 6)]).unsqueeze(0)
    cu = [0, 1, 14, 15, 16, 24]
    runs = []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=tr_hf.NAME)
        run = torch.compile(model, fullgraph=True, backend="aot_eager") if compiled else model
        losses, grads = [], []
        for packed in ({"position_ids": pos}, {"cu_seqlens": cu}):
            batch = tr_hf.shard_batch(ids, **packed)
            labels = batch.pop("shift_labels")
            loss = tr_hf.ring_loss(run(**batch).logits, labels)
            loss.backward()
            losses.append(loss.item())
            grads.append({k: p.grad.clone() for k, p in model.named_parameters()})
            model.zero_grad()
        runs.append((losses, grads))
    (la, ga), (lb, gb) = runs
    grad = max(float((a[k] - b[k]).abs().max()) for a, b in zip(ga, gb, strict=True) for k in a)
    return dict(loss=max(abs(x - y) for x, y in zip(la, lb, strict=True)), grad=grad)


def _is_case(case) -> bool:
    return isinstance(case, dict) and "eager" in case and "diff" in case


@functools.cache
def _results():
    return values(run_ranks(_drift, 2, timeout=900))


def test_eager_and_compiled_agree_the_same_header_and_results():
    """(The compiled output is always contiguous, whatever q's storage: the operator's fake
    promises that; values and the agreed wire layout are what must match.)"""
    bad = []
    for rank, res in enumerate(_results()):
        for name, case in res.items():
            if not _is_case(case):
                continue
            if not case["eager"] or case["eager"] != case["compiled"] or case["diff"] >= TOL:
                bad.append((rank, name, case))
    assert not bad, bad


def test_header_records_the_option():
    """The recorded header does change with each option (the guard above is not vacuous)."""
    res = _results()[0]
    header = {name: case["eager"][0] for name, case in res.items() if _is_case(case)}
    assert header["timeout-infer"][1] == 60.0 and header["plain-infer"][1] is None
    assert header["cu-seqlens-train"][4] is not None and header["plain-train"][4] is None
    assert header["kernel-math-infer"][2] == "math"
    assert header["gqa-infer"][0] != header["plain-infer"][0]
    assert header["swapped-wire-infer"][0] != header["bhsd-infer"][0]  # the storage vote
    # the split: one header field (kind and length), whatever carries its documents
    from tokenring_xdit.ring.agree.header import FIELDS

    at = FIELDS.index("split")
    assert header["documents-causal-train"][0][at] == header["documents-split-infer"][0][at]
    assert header["documents-causal-train"][0][at] != header["cu-seqlens-causal-train"][0][at]
    assert header["plain-train"][0][at] == 0 and header["causal-train"][0][at] != 0


@pytest.mark.parametrize("name", [r[0] for r in REFUSED])
def test_refused_options_refused_compiled_with_the_same_error(name):
    for res in _results():
        case = res[name]
        assert case["eager"] != "no error", case
        assert case["eager"] == case["compiled"], case


def test_packed_documents_compile_without_graph_breaks():
    for res in _results():
        assert res["graph_breaks"] == 0, res["graph_breaks"]
        assert res["default_compile"]["breaks"] == 0, res["default_compile"]
        assert res["default_compile"]["diff"] < TOL, res["default_compile"]


def test_packed_llama_compiled_trains_like_eager():
    for res in _results():
        assert res["llama"]["loss"] < 1e-6 and res["llama"]["grad"] < 1e-5, res["llama"]
