"""The split as one value through real gloo rings (N = 2, 3): cut, called, agreed, compiled.

- shard / unshard round trip for every kind (zigzag, contiguous, documents, auto's pick): the
  shard is the full row at `shard_positions(split, rank)`, unshard gives the row back;
- agreed as ONE header field: splits that differ across ranks (in length, in kind), a split of
  another ring size, one rank without any, are refused with the same error on every rank, naming
  each rank's split in words;
- the documents come with the split, or beside a split without them (cu_seqlens, or position
  ids that restart: a contiguous split's documents learnt from claims); every form is exact
  against fp64 attention under the document mask;
- compiled (torch.compile fullgraph, aot_eager) = eager for a split with its documents and for
  one without them beside a cu_seqlens tensor; a new packing of the second form (the same
  number of documents) compiles no new graph; splits of several lengths (which the graph may
  take as symbolic) compile and match too.
"""

from __future__ import annotations

import functools

import pytest

from tests.distributed.test_packed_documents import _reference
from tests.harness import run_ranks, values

TOL = 2e-5


def _try(fn) -> str:
    try:
        fn()
    except (ValueError, NotImplementedError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _round_trips(torch, n: int) -> dict:
    from tokenring_xdit import make_split, shard, shard_positions, unshard

    total, cu = 12 * n, [0, 1, 5, 12 * n - 1, 12 * n]
    full = torch.arange(2.0 * total).reshape(1, total, 2)
    ok = {}
    for causal in (True, False):
        for layout in ("zigzag", "contiguous", "documents", "auto"):
            split = make_split(total, n, causal=causal, cu_seqlens=cu, layout=layout)
            mine = shard(full, split=split)
            pos = shard_positions(split, torch.distributed.get_rank())
            ok[f"{causal}/{layout}/{split.kind}"] = torch.equal(mine, full[:, pos]) and (
                torch.equal(unshard(mine, split=split), full)
            )
    return ok


def _refusals(torch, rank: int, n: int) -> dict:
    from dataclasses import replace

    from tokenring_xdit import make_split, shard, token_ring_attn

    s = 8 * n
    full = torch.randn(1, s, 2, 8)
    zig = make_split(s, n, causal=True)
    docs = make_split(s, n, causal=True, cu_seqlens=[0, 3, s], layout="documents")
    x = shard(full, split=zig)

    def call(split, **kw):
        return lambda: token_ring_attn(x, x, x, causal=True, split=split, **kw)

    return {
        "length": _try(call(zig if rank == 0 else make_split(2 * s, n, causal=True))),
        "kind": _try(call(replace(docs, kind="zigzag") if rank == 0 else docs)),  # same documents
        "ring_size": _try(call(make_split(8 * (n + 1), n + 1, causal=True))),
        "one_without": _try(call(None if rank == 0 else zig)),
        "documents_differ": _try(call(replace(docs, docs=None), cu_seqlens=[0, 2 + rank, s])),
    }


def _exact(torch, rank: int, n: int) -> dict:
    """One causal packed row through every form of its documents, vs fp64 under the mask."""
    from dataclasses import replace

    from tokenring_xdit import make_split, shard, shard_positions, token_ring_attn_func

    s, cu = 6 * n, [0, 4, 5, 6 * n]
    gen = torch.Generator().manual_seed(7)
    q, k, v, do = (torch.randn(1, s, 2, 8, generator=gen, dtype=torch.float64) for _ in "qkvo")
    q, k, v, do = (x.float().double() for x in (q, k, v, do))
    ref = _reference(torch, q, k, v, do, cu, True)
    restart = torch.cat([torch.arange(b - a) for a, b in zip(cu, cu[1:], strict=False)])
    errs = {}
    for form in ("with", "beside", "contiguous_ids"):
        layout = "contiguous" if form == "contiguous_ids" else "documents"
        split = make_split(s, n, causal=True, cu_seqlens=cu, layout=layout)
        ins = [shard(x, split=split).float().requires_grad_() for x in (q, k, v)]
        kw: dict = {"split": split}
        if form == "beside":
            kw = {"split": replace(split, docs=None), "cu_seqlens": torch.tensor(cu)}
        if form == "contiguous_ids":
            kw = {"split": replace(split, docs=None), "position_ids": shard(restart, split=split,
                                                                            dim=0)}  # fmt: skip
        out = token_ring_attn_func(*ins, causal=True, **kw)
        out.backward(shard(do, split=split).float())
        pos = shard_positions(split, rank)
        got = [out, *(x.grad for x in ins)]
        want = [ref[0], *ref[2:]]
        errs[form] = max((a.double() - b[:, pos]).abs().max().item()
                         for a, b in zip(got, want, strict=True))  # fmt: skip
    return errs


def _compiled(torch, rank: int, n: int) -> dict:
    from dataclasses import replace

    from torch._dynamo.testing import CompileCounterWithBackend

    from tokenring_xdit import make_split, shard, token_ring_attn

    s = 8 * n
    gen = torch.Generator().manual_seed(3)
    full = torch.randn(1, s, 2, 8, generator=gen)
    found = {}
    for name, cus in (("with", [[0, 3, s]]), ("beside", [[0, 3, s], [0, 5, s]])):
        torch._dynamo.reset()
        cnt = CompileCounterWithBackend("aot_eager")
        diff = 0.0
        for cu in cus:
            split = make_split(s, n, causal=True, cu_seqlens=cu, layout="documents")
            x = shard(full, split=split)
            kw = {"split": split}
            if name == "beside":  # a new packing: a new tensor of the same shape
                kw = {"split": replace(split, docs=None), "cu_seqlens": torch.tensor(cu)}

            def fn(q, **kw):
                return token_ring_attn(q, q, q, causal=True, **kw)[0] * 2.0

            compiled = torch.compile(fn, fullgraph=True, backend=cnt)
            with torch.no_grad():
                diff = max(diff, float((compiled(x, **kw) - fn(x, **kw)).abs().max()))
        found[name] = {"diff": diff, "frames": cnt.frame_count}
    # sequences of several lengths: the split's length may become symbolic in the graph
    torch._dynamo.reset()
    cnt, diff = CompileCounterWithBackend("aot_eager"), 0.0

    def dense(q, split):
        return token_ring_attn(q, q, q, causal=True, split=split)[0] * 2.0

    compiled = torch.compile(dense, fullgraph=True, backend=cnt)
    for total in (s, 2 * s, 3 * s):
        split = make_split(total, n, causal=True)
        x = shard(torch.randn(1, total, 2, 8, generator=gen), split=split)
        with torch.no_grad():
            diff = max(diff, float((compiled(x, split) - dense(x, split)).abs().max()))
    found["lengths"] = {"diff": diff, "frames": cnt.frame_count}
    return found


def _worker(rank: int, n: int) -> dict:
    import torch

    torch.set_num_threads(1)
    return {
        "round_trips": _round_trips(torch, n),
        "refusals": _refusals(torch, rank, n),
        "exact": _exact(torch, rank, n),
        "compiled": _compiled(torch, rank, n),
    }


@functools.cache
def _launch(n: int) -> list:
    return values(run_ranks(_worker, n, timeout=400))


@pytest.mark.parametrize("n", [2, 3])
def test_shard_and_unshard_round_trip_every_kind(n):
    for rank, res in enumerate(_launch(n)):
        kinds = {key.split("/")[2] for key in res["round_trips"]}
        assert kinds == {"zigzag", "contiguous", "documents"}, (rank, res["round_trips"])
        assert all(res["round_trips"].values()), (rank, res["round_trips"])


EXPECT = {
    "length": ["split of the sequence", "differs across ring ranks",
               f"rank 0 has the zigzag split of {8 * 2} tokens over 2 ranks, cut by"],
    "kind": ["split of the sequence", "differs across ring ranks", "rank 0 has the zigzag split",
             "rank 1 has the documents split"],
    "ring_size": ["rejected on ring rank(s) [0, 1", "the split does not fit this call",
                  "this ring has 2 ranks"],
    "one_without": ["rejected on ring rank(s) [0]:", "needs proof"],
    "documents_differ": ["packed documents", "differs across ring ranks"],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_splits_that_do_not_agree_are_one_error_on_every_rank(name):
    said = [res["refusals"][name] for res in _launch(2)]
    assert len(set(said)) == 1, said  # the same words on every rank
    for needle in EXPECT[name]:
        assert needle in said[0], (needle, said[0])


@pytest.mark.parametrize("n", [2, 3])
def test_every_form_of_the_documents_is_exact(n):
    for rank, res in enumerate(_launch(n)):
        assert set(res["exact"]) == {"with", "beside", "contiguous_ids"}
        assert max(res["exact"].values()) < TOL, (rank, res["exact"])


@pytest.mark.parametrize("n", [2, 3])
def test_compiled_equals_eager_and_a_new_packing_compiles_nothing(n):
    for rank, res in enumerate(_launch(n)):
        for name, case in res["compiled"].items():
            # three lengths: at most one more graph, with the length symbolic
            most = 2 if name == "lengths" else 1
            assert case["diff"] < 1e-6 and 1 <= case["frames"] <= most, (rank, name, case)
