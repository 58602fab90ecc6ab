"""Bad input fails on EVERY rank of the ring with a clear error, instead of hanging one of them.

The scenarios of one ring size share one launch (tests/harness.py run_cases), each on a fresh
group of its own: a failed ring call can leave gloo traffic behind, and on its own group that
cannot poison the next scenario. A scenario that hangs a rank ends at its group's timeout
(GROUP_TIMEOUT) as that scenario's error; one that hangs the launch fails it naming the scenario.
"""

from __future__ import annotations

import functools

import pytest

from tests.harness import run_cases

GROUP_TIMEOUT = 30  # seconds (stretched by the machine's slowness): one scenario's waits


def _qkv(torch, *, b=1, s=16, kv=24, h=2, d=64, dtype=None, layout="bshd", seed=0):
    gen = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.float32
    shape_q = (b, s, h, d) if layout == "bshd" else (b, h, s, d)
    shape_kv = (b, kv, h, d) if layout == "bshd" else (b, h, kv, d)
    q = torch.randn(shape_q, generator=gen).to(dtype)
    k = torch.randn(shape_kv, generator=gen).to(dtype)
    v = torch.randn(shape_kv, generator=gen).to(dtype)
    return q, k, v


def _scenario(rank, n, world, name):
    """Run one bad call on every rank of `world` (the scenario's own group of all ranks);
    whatever it raises comes back as the RankResult's error."""
    import os

    import torch
    import torch.distributed as dist

    from tokenring_xdit.ring import setup_token_ring_group, token_ring_attn

    if name == "not_member":
        ring = dist.new_group([0, 1])  # collective: every rank creates it
        if rank < 2:  # (None would mean the default group, as in TokenRing calls)
            setup_token_ring_group(ring)
        q, k, v = _qkv(torch, seed=rank)
        with torch.no_grad():
            out, _ = token_ring_attn(q, k, v, group=ring)  # rank 2 is not in `ring`
        # ranks 0 and 1: a ring smaller than the world still computes exact attention
        qs, ks, vs = zip(*(_qkv(torch, seed=r) for r in range(2)), strict=True)
        gq, gk, gv = (torch.cat(x, dim=1).transpose(1, 2).double() for x in (qs, ks, vs))
        ref = torch.nn.functional.scaled_dot_product_attention(gq, gk, gv).transpose(1, 2)
        return (out.double() - ref[:, 16 * rank : 16 * (rank + 1)]).abs().max().item()
    if name == "no_out_group":
        setup_token_ring_group(world)
        fresh = dist.new_group(list(range(n)))  # never passed to setup_token_ring_group
        q, k, v = _qkv(torch, seed=rank)
        with torch.no_grad():
            out, _ = token_ring_attn(q, k, v, group=fresh)  # makes its communicators itself
        qs, ks, vs = zip(*(_qkv(torch, seed=r) for r in range(n)), strict=True)
        gq, gk, gv = (torch.cat(x, dim=1).transpose(1, 2).double() for x in (qs, ks, vs))
        ref = torch.nn.functional.scaled_dot_product_attention(gq, gk, gv).transpose(1, 2)
        return (out.double() - ref[:, 16 * rank : 16 * (rank + 1)]).abs().max().item()

    setup_token_ring_group(world)
    kwargs: dict = {"group": world}
    if name == "head_count":
        q, k, v = _qkv(torch, h=3 if rank == 1 else 2)
    elif name == "head_size":
        q, k, v = _qkv(torch, d=72 if rank == 1 else 64)
    elif name == "dtype":
        q, k, v = _qkv(torch, dtype=torch.bfloat16 if rank == 1 else torch.float32)
    elif name == "batch":
        q, k, v = _qkv(torch, b=2 if rank == 0 else 1)
    elif name == "layout":
        q, k, v = _qkv(torch, layout="bhsd" if rank == 1 else "bshd")
        kwargs["layout"] = "bhsd" if rank == 1 else "bshd"
    elif name == "final_chunks":
        q, k, v = _qkv(torch)
        kwargs["final_chunks"] = 2 if rank == 1 else 1
    elif name in ("final_chunks_env_bad_rank1", "final_chunks_env_differs"):
        from tokenring_xdit.config import ENV

        FINAL_CHUNKS_ENV = ENV["final_chunks"][0]

        q, k, v = _qkv(torch)
        bad = name == "final_chunks_env_bad_rank1"
        os.environ[FINAL_CHUNKS_ENV] = ("two" if bad else "2") if rank == 1 else "1"  # run_cases
        # puts the variable back after the scenario
    elif name == "causal_all":
        q, k, v = _qkv(torch)
        kwargs["causal"] = True
    elif name == "causal_one":
        q, k, v = _qkv(torch)
        kwargs["causal"] = rank == 0
    elif name == "q_3d_rank0":
        q, k, v = _qkv(torch)
        if rank == 0:
            q = q[:, :, 0]  # (b, s, d)
    elif name == "kv_len_rank1":
        q, k, v = _qkv(torch)
        if rank == 1:
            v = v[:, :-1]
    elif name == "causal_odd_len":
        q, k, v = _qkv(torch, s=15, kv=15)  # a zigzag shard is two equal halves
        kwargs["causal"] = True
    elif name == "causal_contiguous":
        # equal even contiguous shards: no shape shows it, only the missing proof does
        q, k, v = _qkv(torch, kv=16)
        kwargs["causal"] = True
    elif name == "causal_torch_chunk":
        # torch.chunk(10 tokens, 2N=4) = 3, 3, 3, 1: rank 0 holds chunks 0+3 (4), rank 1 1+2 (6),
        # while the split says 12 (the sequence padded to 2N)
        from tokenring_xdit import make_split

        s = 4 if rank == 0 else 6
        q, k, v = _qkv(torch, s=s, kv=s)
        kwargs.update(causal=True, split=make_split(12, 2, causal=True))
    elif name == "split_other_ring":  # a split made for another ring size: on every rank
        from tokenring_xdit import make_split

        q, k, v = _qkv(torch, kv=16)
        kwargs.update(causal=True, split=make_split(48, 3, causal=True))
    elif name == "causal_wrong_positions":
        q, k, v = _qkv(torch, kv=16)
        kwargs.update(causal=True, positions=torch.arange(16 * rank, 16 * (rank + 1)))
    elif name == "kernel_name_rank1":
        q, k, v = _qkv(torch)
        kwargs["kernel"] = "no_such_kernel" if rank == 1 else "auto"
    elif name == "kernel_family":
        from tokenring_xdit.ring.kernels import math

        q, k, v = _qkv(torch)
        kwargs["kernel"] = math if rank == 1 else "math"  # a callable's family is its name
    elif name == "requires_grad_joint":
        q, k, v = (x.requires_grad_() for x in _qkv(torch))
        joint = _qkv(torch, s=4, kv=4)[1:]
        token_ring_attn(q, k, v, joint_kv=joint, **kwargs)  # grad mode on
        return "no error"
    elif name == "requires_grad_rank1":
        q, k, v = _qkv(torch)
        q.requires_grad_(rank == 1)
        token_ring_attn(q, k, v, **kwargs)
        return "no error"
    elif name == "validate_always_changes":
        # first call consistent, second call: rank 1's inputs change out of step with rank 0's
        q, k, v = _qkv(torch)
        with torch.no_grad():
            out, _ = token_ring_attn(q, k, v, **kwargs)
        assert out.shape == q.shape
        if rank == 1:
            q, k, v = _qkv(torch, h=4)
    else:
        raise AssertionError(f"unknown scenario {name}")
    with torch.no_grad():
        token_ring_attn(q, k, v, **kwargs)
    return "no error"


# (scenario, what its message must say)
VALUE_ERRORS = [
    ("head_count", ["head count differs across ring ranks", "rank 0 has 2, rank 1 has 3"]),
    ("head_size", ["head size differs across ring ranks", "rank 0 has 64, rank 1 has 72"]),
    ("dtype", ["dtype differs across ring ranks: rank 0 has float32, rank 1 has bfloat16"]),
    ("batch", ["batch size differs across ring ranks", "rank 0 has 2, rank 1 has 1"]),
    ("layout", ["layout differs across ring ranks: rank 0 has bshd, rank 1 has bhsd"]),
    ("final_chunks", ["final_chunks differs across ring ranks: rank 0 has 1, rank 1 has 2"]),
    ("final_chunks_env_differs", ["final_chunks differs", "rank 0 has 1, rank 1 has 2"]),
    ("final_chunks_env_bad_rank1", ["rank(s) [1]", "TOKENRING_XDIT_FINAL_CHUNKS"]),
    ("q_3d_rank0", ["rank(s) [0]", "4-d tensors"]),
    # one rank training, the other not: the two would run different schedules
    (
        "requires_grad_rank1",
        ["gradient mode", "rank 0 has non-causal inference, rank 1 has non-causal training"],
    ),
    ("kv_len_rank1", ["rank(s) [1]", "same sequence length"]),
    (
        "kernel_family",  # named in words, not as a digest
        ["kernel family", "rank 0 has 'math', rank 1 has 'tokenring_xdit.ring.kernels.math'"],
    ),
]
NOT_IMPLEMENTED = [
    # causal needs zigzag shards: q and k/v of one (even) length per rank
    ("causal_all", ["rank(s) [0, 1]", "causal=True needs zigzag shards"]),
    ("causal_one", ["rank(s) [0]", "causal=True needs zigzag shards"]),
    ("causal_odd_len", ["rank(s) [0, 1]", "causal=True needs zigzag shards"]),
    ("requires_grad_joint", ["rank(s) [0, 1]", "gradients through joint K/V"]),
]
UNPROVEN = [
    # a causal call must prove its zigzag layout; wrong results would be silent otherwise
    ("causal_contiguous", ["rank(s) [0, 1]", "needs proof", "tokenring_xdit.shard"]),
    ("causal_torch_chunk", ["local lengths [4, 6]", "torch.chunk makes unequal chunks"]),
    ("split_other_ring", ["rank(s) [0, 1]", "the split does not fit", "this ring has 2"]),
    ("causal_wrong_positions", ["rank(s) [0, 1]", "not this rank's zigzag positions"]),
    # a kernel name only one rank cannot use: every rank raises, naming that rank
]
# the scenarios of ring 3; every other one runs on ring 2
RING_3 = ("no_out_group", "not_member")
SCENARIOS = (*(name for name, _ in VALUE_ERRORS + NOT_IMPLEMENTED + UNPROVEN),
             "kernel_name_rank1", "validate_always_changes")  # fmt: skip
ENVS = {"validate_always_changes": {"TOKENRING_XDIT_VALIDATE": "always"}}


def _launch(name):
    return _outcomes(3 if name in RING_3 else 2)[name]


@functools.cache
def _outcomes(n):
    names = RING_3 if n == 3 else SCENARIOS
    return run_cases(_scenario, n, names, envs=ENVS, group_timeout=GROUP_TIMEOUT, timeout=300)


def _assert_all_raise(results, error_type, *needles):
    for r in results:
        assert r.error_type == error_type, (
            f"rank {r.rank}: expected {error_type}, got {r.error_type}: {r.error}\n{r.trace}"
        )
        for needle in needles:
            assert needle in r.error, f"rank {r.rank}: {needle!r} not in error: {r.error}"
    # every rank reports the same problem
    assert len({r.error for r in results}) == 1, [r.error for r in results]


@pytest.mark.timeout(300)  # the first test of a ring size waits for all its scenarios
@pytest.mark.parametrize("name,needles", VALUE_ERRORS)
def test_inconsistent_or_invalid_inputs_raise_value_error_everywhere(name, needles):
    _assert_all_raise(_launch(name), "ValueError", *needles)


@pytest.mark.timeout(300)  # the first test of a ring size waits for all its scenarios
@pytest.mark.parametrize("name,needles", NOT_IMPLEMENTED)
def test_unsupported_modes_raise_not_implemented_everywhere(name, needles):
    _assert_all_raise(_launch(name), "NotImplementedError", *needles)


@pytest.mark.timeout(300)  # the first test of a ring size waits for all its scenarios
@pytest.mark.parametrize("name,needles", UNPROVEN)
def test_causal_layout_and_kernel_are_checked_everywhere(name, needles):
    _assert_all_raise(_launch(name), "ValueError", *needles)


@pytest.mark.timeout(300)  # the first test of a ring size waits for all its scenarios
def test_a_kernel_name_only_one_rank_cannot_use_fails_every_rank():
    """Every rank raises, naming the rank that has the problem and what it is."""
    r0, r1 = _launch("kernel_name_rank1")
    for r in (r0, r1):
        assert r.error_type == "ValueError" and "rank(s) [1]" in r.error, (r.rank, r.error)
        assert "the kernel cannot be used" in r.error, r.error
    assert "unknown kernel 'no_such_kernel'" in r1.error, r1.error
    assert "unknown kernel 'no_such_kernel'" in r0.error, r0.error  # in words on every rank


@pytest.mark.timeout(300)  # the first test of a ring size waits for all its scenarios
def test_group_without_setup_makes_its_communicators():
    """Like yunchang's rings, TokenRing works with any group: a group never passed to
    setup_token_ring_group gets its return communicator on first use (ring members only)."""
    for r in _launch("no_out_group"):
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.error}\n{r.trace}"
        assert r.value <= 1e-5, f"rank {r.rank}: max err {r.value}"


@pytest.mark.timeout(300)  # the first test of a ring size waits for all its scenarios
def test_rank_outside_the_group():
    results = _launch("not_member")
    r2 = results[2]
    assert r2.error_type == "ValueError", (r2.error_type, r2.error, r2.trace)
    assert "not a member" in r2.error and "[0, 1]" in r2.error, r2.error
    for r in results[:2]:
        assert r.ok, f"rank {r.rank} of the ring [0, 1] failed: {r.error_type}: {r.error}"
        assert r.value <= 1e-5, f"rank {r.rank}: ring of 2 inside a world of 3, max err {r.value}"


@pytest.mark.timeout(300)  # the first test of a ring size waits for all its scenarios
def test_validate_always_catches_inputs_changing_out_of_step():
    results = _launch("validate_always_changes")
    _assert_all_raise(results, "ValueError", "head count differs", "rank 0 has 2, rank 1 has 4")
