"""Packed documents through the ring: randomized layouts vs exact fp64 per-document attention.

Seeded and reproducible: case i of ring size N draws from random.Random(SEED, N, i) on every
rank a packed sequence (1 to 30 documents, lengths 1 .. the whole sequence, uneven against the
shards: documents shorter than a chunk, crossing chunk and shard boundaries, longer than a
shard), causal (zigzag shards) or not (contiguous shards), MHA or GQA, layout, batch size, and
whether the documents come as cu_seqlens or as position ids that restart. Each rank runs the
differentiable call on its shard (fp32) and compares out, lse, dq, dk, dv with autograd of
exact fp64 attention under the document mask on the whole sequence. It also counts its kernel
calls and Q transfers, which must equal the pure plan's (`document_work`): blocks without a
shared document are skipped. One launch per ring size runs all its cases (gloo, CPU), plus the
error cases (documents that differ across ranks: one error on every rank).
"""

from __future__ import annotations

import random

import pytest

from tests.harness import run_ranks, values

SEED = 20260533
CASES_PER_SIZE = 30  # x 4 ring sizes = 120 cases
TOL = 2e-5


def _draw(n: int, i: int) -> dict:
    rng = random.Random(f"{SEED}/{n}/{i}")
    total = 2 * n * rng.choice([1, 2, 3, 5, 8])
    count = rng.randint(1, min(30, total))
    if rng.random() < 0.15:
        count = 1  # one document longer than any shard
    cuts = sorted(rng.sample(range(1, total), count - 1))
    return {
        "total": total,
        "cu": [0, *cuts, total],
        "causal": rng.random() < 0.75,
        "b": rng.choice([1, 1, 2]),
        "h": 4,
        "hk": rng.choice([4, 2, 1]),
        "d": rng.choice([8, 16]),
        "layout": rng.choice(["bshd", "bhsd"]),
        "by_positions": rng.random() < 0.4,
        "seed": rng.randrange(2**31),
    }


def _doc_mask(torch, cu: list[int], causal: bool):
    total = cu[-1]
    doc = torch.zeros(total, dtype=torch.long)
    for i, (a, b) in enumerate(zip(cu, cu[1:], strict=False)):
        doc[a:b] = i
    mask = doc[:, None] == doc[None, :]
    if causal:
        mask &= torch.ones(total, total, dtype=torch.bool).tril()
    return mask


def _reference(torch, q, k, v, do, cu, causal):
    """fp64 out, lse, dq, dk, dv of the whole sequence under the document mask (b, S, h, d)."""
    g = q.shape[2] // k.shape[2]
    ins = [x.clone().requires_grad_() for x in (q, k, v)]
    qb = ins[0].transpose(1, 2)
    kb, vb = (x.repeat_interleave(g, dim=2).transpose(1, 2) for x in ins[1:])
    scores = (qb @ kb.transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~_doc_mask(torch, cu, causal), float("-inf"))
    lse = torch.logsumexp(scores, -1)
    out = (torch.softmax(scores, -1) @ vb).transpose(1, 2)
    out.backward(do)
    return out.detach(), lse.detach(), *(x.grad for x in ins)


def _case(rank: int, n: int, c: dict) -> dict:
    import torch

    from tokenring_xdit import make_split, shard
    from tokenring_xdit.ring.api import token_ring_attn
    from tokenring_xdit.ring.comm import COUNTERS

    gen = torch.Generator().manual_seed(c["seed"])
    b, s, h, hk, d = c["b"], c["total"], c["h"], c["hk"], c["d"]
    q, do = (torch.randn(b, s, h, d, generator=gen, dtype=torch.float64) for _ in "qo")
    k, v = (torch.randn(b, s, hk, d, generator=gen, dtype=torch.float64) for _ in "kv")
    q, k, v, do = (x.float().double() for x in (q, k, v, do))  # the ring's rounded inputs
    causal, cu = c["causal"], c["cu"]
    ref = _reference(torch, q, k, v, do, cu, causal)

    def local(x):  # (b, S, ...) -> this rank's shard, in the case's layout
        x = shard(x, causal=causal, dim=1)
        return x if c["layout"] == "bshd" else x.transpose(1, 2).contiguous()

    def back(x):
        return x if c["layout"] == "bshd" else x.transpose(1, 2)

    ins = [local(x).float().requires_grad_() for x in (q, k, v)]
    if c["by_positions"]:
        pos = torch.cat([torch.arange(e - a) for a, e in zip(cu, cu[1:], strict=False)])
        kwargs = {"position_ids": shard(pos.expand(b, -1), causal=causal, dim=1)}
    else:
        kwargs = {"cu_seqlens": torch.tensor(cu, dtype=torch.int32)}
    if causal:  # the zigzag split the shards were cut by (not causal: no split, plain shards)
        kwargs["split"] = make_split(s, n, causal=True)
    COUNTERS.reset()
    out, lse = token_ring_attn(*ins, causal=causal, layout=c["layout"], **kwargs)
    fwd_kernels, fwd_q = COUNTERS.kernel_calls, COUNTERS.q_messages
    out.backward(local(do).float())
    errs = {"out": (back(out).double() - shard(ref[0], causal=causal, dim=1)).abs().max().item()}
    ref_lse = shard(ref[1], causal=causal, dim=2)
    errs["lse"] = ((lse.double() - ref_lse).abs() / ref_lse.abs().clamp_min(1)).max().item()
    for name, x, r in zip(("dq", "dk", "dv"), ins, ref[2:], strict=True):
        errs[name] = (back(x.grad).double() - shard(r, causal=causal, dim=1)).abs().max().item()
    return {"errs": errs, "kernels": fwd_kernels, "q_messages": fwd_q}


def _mismatch(rank: int, n: int) -> dict:
    """Errors that must be raised on every rank before any transfer."""
    import torch

    from tokenring_xdit import make_split, shard
    from tokenring_xdit.ring.api import token_ring_attn

    s = 4 * n
    split = make_split(s, n, causal=True)
    x = shard(torch.randn(1, s, 2, 8), split=split, dim=1)
    found = {}
    cases = {
        "cu_differs": {"cu_seqlens": [0, 3 + rank, s]},
        "cu_short": {"cu_seqlens": [0, 3, s - 1]},
        "cu_bad": {"cu_seqlens": [0, 5, 3, s]},
        "kv_len": {"cu_seqlens": [0, s]},
        "pos_bad": {"position_ids": torch.arange(2 * 2 * n // n) * 2},
        "pos_misfit": {"position_ids": torch.arange(s // n) + 3 * rank},
    }
    for name, kw in cases.items():
        k = x[:, :-1] if name == "kv_len" else x
        try:
            token_ring_attn(x, k, k, causal=name != "kv_len", split=split, **kw)
            found[name] = "no error"
        except (ValueError, NotImplementedError) as exc:
            found[name] = f"{type(exc).__name__}: {exc}"
    return found


def _rank(rank: int, n: int) -> dict:
    from tokenring_xdit.ring.packed import document_work

    results = []
    for i in range(CASES_PER_SIZE):
        c = _draw(n, i)
        res = _case(rank, n, c)
        work = document_work(c["cu"], n, causal=c["causal"])["ranks"][rank]
        res["plan_kernels"] = work["kernel_calls"]
        res["plan_q"] = work["q_transfers"]
        results.append(res)
    return {"cases": results, "errors": _mismatch(rank, n) if n > 1 else {}}


@pytest.fixture(scope="module", params=[1, 2, 3, 4])
def ring_results(request):
    n = request.param
    return n, values(run_ranks(_rank, n, timeout=300))


def test_packed_documents_match_exact_attention(ring_results):
    n, results = ring_results
    worst = {}
    for rank, res in enumerate(results):
        for i, case in enumerate(res["cases"]):
            for name, err in case["errs"].items():
                if err > worst.get(name, (0.0,))[0]:
                    worst[name] = (err, rank, i, _draw(n, i))
    print(f"N={n} worst errors:", {k: v[0] for k, v in worst.items()})
    for name, (err, rank, i, c) in worst.items():
        assert err <= TOL, f"{name} error {err:.3g} on rank {rank}, case {i}: {c}"


def test_empty_blocks_are_skipped(ring_results):
    """Kernel calls and Q transfers are those of the pure plan (documents.py), and with several
    ranks some blocks really are skipped."""
    n, results = ring_results
    skipped = 0
    for res in results:
        for case in res["cases"]:
            assert case["kernels"] == case["plan_kernels"]
            assert case["q_messages"] == case["plan_q"]
            skipped += n - case["kernels"]
    if n > 1:
        assert skipped > 0


def test_document_errors_on_every_rank(ring_results):
    n, results = ring_results
    if n == 1:
        pytest.skip("errors across ranks need a ring of several ranks")
    expect = {
        "cu_differs": "packed documents",
        "cu_short": "cu_seqlens end at",
        "cu_bad": "non-decreasing",
        "kv_len": "the query's length",
        "pos_bad": "position_ids",
        "pos_misfit": "do not fit together",
    }
    for name, text in expect.items():
        msgs = [res["errors"][name] for res in results]
        # every rank raises the same kind of error, naming the problem (a rank's own problem
        # text is detailed on that rank: ring/agree/)
        assert len({m.split(":")[0] for m in msgs}) == 1, (name, msgs)
        for msg in msgs:
            assert text in msg, (name, msg)
    # differing documents are shown as the offsets each rank passed, not as digests
    for res in results:
        msg = res["errors"]["cu_differs"]
        assert "rank 0 has cu_seqlens [0, 3, " in msg, msg
        assert "rank 1 has cu_seqlens [0, 4, " in msg, msg
