"""token_ring_attn on real gloo ranks against exact full-sequence attention in one process.

CI has 2 cores, so each world size is ONE launch: the rank function runs every case of the matrix
and returns per-case errors and traffic counters; the tests below assert on that cached result.
Every rank builds the same global Q/K/V from a seeded generator, runs the ring on its shard, and
compares with float64 SDPA over the whole sequence (sliced to its shard).
"""

from __future__ import annotations

import functools

import pytest

from tests.harness import run_ranks, values
from tests.reference import exact_attention

WORLD_SIZES = [1, 2, 3, 4]
# Local lengths per ring rank (first N used): uneven, and K/V longer than Q (a KV cache).
Q_LENS = [37, 42, 29, 51]
KV_LENS = [60, 45, 80, 52]
FP32_TOL = 1e-5
BF16_TOL = 2e-2
# float64 is accepted, but partials are merged in fp32 (by design, see merge.py), so a ring of
# N > 1 gives fp32 accuracy (~2e-7 measured), not fp64's.
FP64_TOL = FP32_TOL


def _case(
    name,
    *,
    b=1,
    h=2,
    d=72,
    layout="bshd",
    dtype="float32",
    final_chunks=None,
    q_lens=Q_LENS,
    kv_lens=KV_LENS,
    kernel="auto",
    scale=None,
    noncontig=False,
    joint=None,
    seed=0,
    defer=None,
):
    """defer: RingConfig.defer_own for the case (None: the configured default)."""
    return dict(
        name=name,
        b=b,
        h=h,
        d=d,
        layout=layout,
        dtype=dtype,
        final_chunks=final_chunks,
        q_lens=q_lens,
        kv_lens=kv_lens,
        kernel=kernel,
        scale=scale,
        noncontig=noncontig,
        joint=joint,
        seed=seed,
        defer=defer,
    )


CASES = [
    _case("bshd-b1-d72-fcNone", seed=1),
    _case("bhsd-b2-d128-fc1", b=2, h=3, d=128, layout="bhsd", final_chunks=1, seed=2, defer=0.0),
    _case("bshd-b2-d64-fc3", b=2, d=64, final_chunks=3, seed=3, defer=0.3),
    # the own block whole at step 0 (defer_own=0) and mostly held back (0.9)
    _case(
        "bhsd-b2-d64-fc1-whole-own", b=2, d=64, layout="bhsd", final_chunks=1, seed=19, defer=0.0
    ),
    _case("bshd-b1-d72-fc2-defer-0.9", final_chunks=2, seed=20, defer=0.9),
    _case("bhsd-b1-d72-fc3", layout="bhsd", final_chunks=3, seed=4),
    _case("bshd-b2-d128-fc1-math", b=2, d=128, final_chunks=1, kernel="math", seed=5),
    _case(
        "bhsd-b2-d64-fcNone-qkv-equal",
        b=2,
        d=64,
        layout="bhsd",
        q_lens=[40] * 4,
        kv_lens=[40] * 4,
        seed=6,
    ),
    _case("bshd-b1-d128-fc3-scale", d=128, final_chunks=3, scale=0.3, seed=7),
    _case(
        "bhsd-b2-d72-fc3-kv-shorter",
        b=2,
        layout="bhsd",
        final_chunks=3,
        q_lens=[50, 33, 64, 41],
        kv_lens=[20, 31, 9, 26],
        seed=8,
    ),
    # more pieces requested than the shortest rank has queries: piece count clamps everywhere
    _case("bshd-b2-d64-fc3-short-q", b=2, d=64, final_chunks=3, q_lens=[5, 2, 7, 3], seed=9),
    _case(
        "bhsd-b1-d64-fc3-q-len-1", d=64, layout="bhsd", final_chunks=3, q_lens=[1, 4, 3, 6], seed=10
    ),
    _case("bshd-b1-d64-fp64", d=64, dtype="float64", final_chunks=3, seed=11),
    _case("bf16-bshd-b2-d128-fc3", b=2, d=128, dtype="bfloat16", final_chunks=3, seed=12),
    _case("bf16-bhsd-b1-d72-fcNone", layout="bhsd", dtype="bfloat16", seed=13),
    _case("bf16-bshd-b1-d64-fc1", d=64, dtype="bfloat16", final_chunks=1, seed=14),
    _case("noncontig-bshd-b2-d72-fc3", b=2, final_chunks=3, noncontig=True, seed=15),
    _case(
        "noncontig-bhsd-b2-d128-fc1",
        b=2,
        d=128,
        layout="bhsd",
        final_chunks=1,
        noncontig=True,
        seed=16,
    ),
    # joint (text) K/V, the same on every rank: each query must meet it exactly once
    _case("joint-rear-bshd-b2-d64-fc3", b=2, d=64, final_chunks=3, joint=("rear", 11), seed=17),
    _case("joint-front-bhsd-b1-d72", layout="bhsd", joint=("front", 5), seed=18),
    _case("joint-rear-bshd-b1-d64-whole-own", d=64, joint=("rear", 7), seed=21, defer=0.0),
]
TOLS = {"float32": FP32_TOL, "bfloat16": BF16_TOL, "float64": FP64_TOL}
# lse is fp32 whatever the dtype; cpu_flash's bf16 lse is ~3e-5 off the fp64 one (measured)
LSE_TOLS = {"float32": FP32_TOL, "bfloat16": 1e-3, "float64": FP32_TOL}


def _global_qkv(case, n, torch):
    """The whole sequence in (b, h, s, d) float64, identical on every rank (seeded)."""
    gen = torch.Generator().manual_seed(1000 + case["seed"])
    b, h, d = case["b"], case["h"], case["d"]
    s_q, s_kv = sum(case["q_lens"][:n]), sum(case["kv_lens"][:n])
    q = torch.randn(b, h, s_q, d, generator=gen, dtype=torch.float64)
    k = torch.randn(b, h, s_kv, d, generator=gen, dtype=torch.float64)
    v = torch.randn(b, h, s_kv, d, generator=gen, dtype=torch.float64)
    joint = None
    if case["joint"] is not None:
        j_len = case["joint"][1]
        joint = tuple(torch.randn(b, h, j_len, d, generator=gen, dtype=torch.float64) for _ in "kv")
    return q, k, v, joint


def _strided_copies(q, k, v, torch):
    """q, k, v again, none contiguous: a transpose view and slices of bigger tensors."""
    q_nc = q.transpose(1, 2).contiguous().transpose(1, 2)
    k_nc = torch.cat([k, torch.full_like(k, 7.0)], dim=3)[..., : k.shape[3]]
    pad = torch.full_like(v, -3.0)
    v_nc = torch.cat([pad, v, pad], dim=0)[v.shape[0] : 2 * v.shape[0], ..., :]
    v_nc = torch.cat([v_nc, pad], dim=3)[..., : v.shape[3]]
    for x, y in ((q, q_nc), (k, k_nc), (v, v_nc)):
        assert torch.equal(x, y)
        assert not y.is_contiguous(), y.stride()
    return q_nc, k_nc, v_nc


def _config(case):
    from tokenring_xdit import config

    cfg = config.current()
    return cfg if case["defer"] is None else cfg.replace(defer_own=case["defer"])


def _expected_traffic(case, n, rank):
    if n == 1:
        return dict(q_messages=0, partial_messages=0, kernel_calls=1)
    cfg = _config(case)
    q_lens = case["q_lens"][:n]
    chunks = case["final_chunks"] or cfg.final_chunks
    chunks = min(chunks, min(q_lens))
    from tokenring_xdit.ring.inference.loop import held_back

    # a held-back part of the own block is one more kernel (never a message)
    split = int(held_back(q_lens[rank], cfg.defer_own) > 0)
    # N-2 regular returns + the final one in `chunks` pieces; every return is out + lse
    return dict(
        q_messages=n - 1,
        partial_messages=2 * (n - 2) + 2 * chunks,
        kernel_calls=n - 1 + chunks + split,
    )


def _run_cases(rank, n, cases):
    import torch
    import torch.distributed as dist

    from tokenring_xdit.ring import COUNTERS, setup_token_ring_group, token_ring_attn

    setup_token_ring_group(dist.group.WORLD)
    results = []
    for case in cases:
        dtype = getattr(torch, case["dtype"])
        b, h, d = case["b"], case["h"], case["d"]
        q_lens, kv_lens = case["q_lens"][:n], case["kv_lens"][:n]
        q0, k0 = sum(q_lens[:rank]), sum(kv_lens[:rank])
        gq, gk, gv, joint = _global_qkv(case, n, torch)
        # round the global inputs to the compute dtype first: the reference sees what the ring sees
        gq, gk, gv = (x.to(dtype).double() for x in (gq, gk, gv))
        all_k, all_v = gk, gv
        if joint is not None:
            joint = tuple(x.to(dtype).double() for x in joint)
            all_k, all_v = torch.cat([gk, joint[0]], dim=2), torch.cat([gv, joint[1]], dim=2)
        scale = case["scale"] if case["scale"] is not None else d**-0.5
        ref_out, ref_lse = exact_attention(gq, all_k, all_v, scale=scale, layout="bhsd")
        ref_out = ref_out[:, :, q0 : q0 + q_lens[rank]]
        ref_lse = ref_lse[:, :, q0 : q0 + q_lens[rank]]

        seq = slice(q0, q0 + q_lens[rank]), slice(k0, k0 + kv_lens[rank])
        local = gq[:, :, seq[0]], gk[:, :, seq[1]], gv[:, :, seq[1]]
        if case["layout"] == "bshd":
            local = tuple(x.transpose(1, 2) for x in local)
            ref_out = ref_out.transpose(1, 2)
        q, k, v = (x.to(dtype).contiguous() for x in local)
        if joint is not None:
            joint = tuple(
                (x.transpose(1, 2) if case["layout"] == "bshd" else x).to(dtype).contiguous()
                for x in joint
            )
            extra = dict(joint_kv=joint, joint_strategy=case["joint"][0])
        else:
            extra = {}
        kwargs = dict(
            group=dist.group.WORLD,
            layout=case["layout"],
            kernel=case["kernel"],
            softmax_scale=case["scale"],
            final_chunks=case["final_chunks"],
            config=_config(case),
            **extra,
        )
        COUNTERS.reset()
        with torch.no_grad():
            out, lse = token_ring_attn(q, k, v, **kwargs)
        traffic = dict(
            q_messages=COUNTERS.q_messages,
            partial_messages=COUNTERS.partial_messages,
            kernel_calls=COUNTERS.kernel_calls,
            handshakes=COUNTERS.handshakes,
            peers=sorted(COUNTERS.by_peer),
        )
        res = dict(
            name=case["name"],
            rank=rank,
            dtype=case["dtype"],
            out_meta=(str(out.dtype), tuple(out.shape), str(lse.dtype), tuple(lse.shape)),
            want_meta=(str(dtype), tuple(q.shape), "torch.float32", (b, h, q_lens[rank])),
            err_out=(out.double() - ref_out).abs().max().item(),
            err_lse=(lse.double() - ref_lse).abs().max().item(),
            traffic=traffic,
        )
        if case["noncontig"]:
            qn, kn, vn = _strided_copies(q, k, v, torch)
            with torch.no_grad():
                out_n, lse_n = token_ring_attn(qn, kn, vn, **kwargs)
            res["noncontig_diff"] = max(
                (out_n.double() - out.double()).abs().max().item(), (lse_n - lse).abs().max().item()
            )
            res["noncontig_err"] = (out_n.double() - ref_out).abs().max().item()
            # inputs untouched (the ring must not write into what it was given)
            res["inputs_intact"] = all(torch.equal(a, b) for a, b in ((qn, q), (kn, k), (vn, v)))
        if case is cases[0]:  # the same call again: identical result; checked again on gloo
            # (validate "auto"), not with the per-signature cache (what NCCL rings use)

            COUNTERS.reset()
            with torch.no_grad():
                out2, lse2 = token_ring_attn(q, k, v, **kwargs)
            res["repeat_equal"] = torch.equal(out2, out) and torch.equal(lse2, lse)
            res["repeat_handshakes"] = COUNTERS.handshakes
            # the validate mode is part of the agreed call: the first call under a new mode is
            # checked once, the next one comes from the cache
            cached = kwargs["config"].replace(validate="signature")
            kwargs = {**kwargs, "config": cached}
            with torch.no_grad():
                token_ring_attn(q, k, v, **kwargs)
                COUNTERS.reset()
                out3, _ = token_ring_attn(q, k, v, **kwargs)
            res["repeat_equal"] &= torch.equal(out3, out)
            res["cached_handshakes"] = COUNTERS.handshakes
        results.append(res)
    return results


@functools.cache
def _results(n: int) -> tuple:
    """Per rank, per case results of one launch of `n` ranks (cached across the tests)."""
    return tuple(values(run_ranks(_run_cases, n, CASES, timeout=150)))


def _flat(n):
    return [res for rank_results in _results(n) for res in rank_results]


def _worst(n, dtype, key="err_out"):
    rows = [r for r in _flat(n) if r["dtype"] == dtype]
    worst = max(rows, key=lambda r: r[key])
    return worst[key], f"{worst['name']} rank {worst['rank']}"


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_all_cases_ran_on_every_rank(n):
    got = _results(n)
    assert len(got) == n
    for rank, rank_results in enumerate(got):
        assert [r["name"] for r in rank_results] == [c["name"] for c in CASES], rank
        for r in rank_results:
            assert r["out_meta"] == r["want_meta"], (r["name"], rank, r["out_meta"], r["want_meta"])


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_matches_full_attention(n, dtype):
    tol = TOLS[dtype]
    rows = [r for r in _flat(n) if r["dtype"] == dtype]
    assert rows, dtype
    bad = [(r["name"], r["rank"], f"{r['err_out']:.3g}") for r in rows if not r["err_out"] <= tol]
    worst, where = _worst(n, dtype)
    assert not bad, f"N={n} {dtype}: out error > {tol} in {bad}; worst {worst:.3g} ({where})"
    lse_tol = LSE_TOLS[dtype]
    bad = [
        (r["name"], r["rank"], f"{r['err_lse']:.3g}") for r in rows if not r["err_lse"] <= lse_tol
    ]
    worst_lse, where_lse = _worst(n, dtype, "err_lse")
    assert not bad, (
        f"N={n} {dtype}: lse error > {lse_tol} in {bad}; worst {worst_lse:.3g} ({where_lse})"
    )
    assert worst <= tol, f"N={n} {dtype}: worst out {worst:.3g} ({where}), lse {worst_lse:.3g}"


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_traffic_counters_follow_the_schedule(n):
    for r in _flat(n):
        want = _expected_traffic(next(c for c in CASES if c["name"] == r["name"]), n, r["rank"])
        got = {key: r["traffic"][key] for key in want}
        assert got == want, f"N={n} {r['name']} rank {r['rank']}: {got} != {want}"
        assert r["rank"] not in r["traffic"]["peers"], f"self-send on rank {r['rank']}: {r}"
        # every other rank receives something from this one (its Q or a partial)
        others = sorted(set(range(n)) - {r["rank"]})
        assert r["traffic"]["peers"] == others, (n, r["rank"], r["traffic"])


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_final_chunks_one_gives_minimal_traffic(n):
    rows = [r for r in _flat(n) if r["name"] == "bhsd-b2-d128-fc1"]
    assert len(rows) == n
    for r in rows:
        t = r["traffic"]
        got = (t["q_messages"], t["partial_messages"], t["kernel_calls"])
        assert got == (n - 1, 2 * (n - 1), n), (
            f"N={n} rank {r['rank']}: (q, partial, kernels) {got}"
        )


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_non_contiguous_inputs_give_the_same_result(n):
    rows = [r for r in _flat(n) if "noncontig_diff" in r]
    assert len(rows) == 2 * n
    for r in rows:
        assert r["inputs_intact"], f"N={n} {r['name']} rank {r['rank']}: inputs modified"
        assert r["noncontig_diff"] <= 1e-6, (
            f"N={n} {r['name']} rank {r['rank']}: strided vs contiguous differ by "
            f"{r['noncontig_diff']:.3g}"
        )
        assert r["noncontig_err"] <= FP32_TOL, (n, r["name"], r["rank"], r["noncontig_err"])


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_repeat_call_is_checked_or_cached_and_deterministic(n):
    rows = [r for r in _flat(n) if "repeat_equal" in r]
    assert len(rows) == n
    for r in rows:
        assert r["repeat_equal"], f"N={n} rank {r['rank']}: second identical call differs"
        expected = 1 if n > 1 else 0  # gloo: every call; a ring of one exchanges nothing
        assert r["repeat_handshakes"] == expected, (n, r["rank"], r["repeat_handshakes"])
        assert r["cached_handshakes"] == 0, (n, r["rank"], r["cached_handshakes"])


def _calls(rank, n, calls, kernel="auto"):
    """Several ring calls in a row; calls = [(q_lens, kv_lens), ...]. Max error of each call."""
    import torch
    import torch.distributed as dist

    from tokenring_xdit.ring import setup_token_ring_group, token_ring_attn

    setup_token_ring_group(dist.group.WORLD)
    errors = []
    for i, (q_lens, kv_lens) in enumerate(calls):
        gen = torch.Generator().manual_seed(500 + i)
        gq = torch.randn(1, 2, sum(q_lens), 64, generator=gen, dtype=torch.float64)
        gk, gv = (
            torch.randn(1, 2, sum(kv_lens), 64, generator=gen, dtype=torch.float64) for _ in "kv"
        )
        q0, k0 = sum(q_lens[:rank]), sum(kv_lens[:rank])
        ref = exact_attention(gq, gk, gv, layout="bhsd")[0][:, :, q0 : q0 + q_lens[rank]]
        q = gq[:, :, q0 : q0 + q_lens[rank]].float()
        k, v = (x[:, :, k0 : k0 + kv_lens[rank]].float() for x in (gk, gv))
        with torch.no_grad():
            out, _ = token_ring_attn(q, k, v, layout="bhsd", kernel=kernel)
        errors.append((out.double() - ref).abs().max().item() if out.numel() else 0.0)
    return errors


def test_kv_length_change_on_one_rank_does_not_deadlock():
    """BUG (ring/agree/, check_inputs): the handshake is skipped when this rank's own signature is
    cached, and the local K/V length is part of that signature. A KV cache that changes length on
    one rank only (valid input: K/V never leave their rank, no peer needs that length) sends that
    rank into the all-gather while the others skip it and post their P2P: a deadlock, in the
    default validation mode."""
    calls = [([8, 8], [60, 45]), ([8, 8], [60, 50])]
    results = run_ranks(_calls, 2, calls, timeout=15)  # raises TimeoutError on the hang
    errs = values(results)
    assert max(max(e) for e in errs) <= FP32_TOL, errs


@pytest.mark.parametrize(
    "q_lens,kv_lens", [([8, 8], [8, 0]), ([8, 0], [8, 8])], ids=["empty-kv", "empty-q"]
)
def test_empty_local_shard_is_exact_or_rejected_everywhere(q_lens, kv_lens):
    """BUG: an empty local Q or K/V passes the input checks and reaches the auto kernel
    (cpu_flash), which kills the process with SIGFPE; the peers then fail or hang. Wanted: the
    exact result (an empty K/V block adds nothing; math kernel gets it right), or a ValueError on
    every rank."""
    results = run_ranks(_calls, 2, [(q_lens, kv_lens)], timeout=30)
    if all(r.ok for r in results):
        errs = [e for r in results for e in r.value]
        assert max(errs) <= FP32_TOL, f"empty shard {q_lens} {kv_lens}: errors {errs}"
    else:
        for r in results:
            assert r.error_type == "ValueError", (r.rank, r.error_type, r.error)


def test_empty_local_shard_with_math_kernel_is_exact():
    """The same shapes through the exact math kernel work: the ring itself handles empty shards."""
    # every rank's signature changes between the calls (see the deadlock test above)
    calls = [([8, 8, 6], [8, 0, 8]), ([9, 0, 7], [7, 9, 5])]
    errs = values(run_ranks(_calls, 3, calls, "math", timeout=60))
    assert max(max(e) for e in errs) <= FP32_TOL, errs
