"""Failures are bounded and named: every live rank raises a clear error within the group's timeout.

Scenarios that must work (any group, lazy set-up, lengths changing on one rank, yunchang kernels
on CPU) and mismatches that must fail on every rank share one launch of ring 2
(tests/harness.py run_cases), each on a fresh group with a short gloo timeout (GROUP_TIMEOUT_S)
of its own, so that what a failed call leaves behind cannot reach the next scenario; each
scenario's own time is bounded, and a hang fails the launch naming the scenario. A peer that
fails mid-call is its own launch (the process dies or its ring is gone). Every bound is
stretched by the machine's measured slowness (tests/speed.py): a peer that is merely slow to
start must not read as a dead one.
"""

from __future__ import annotations

import functools
import os
import tempfile
import time

import pytest

from tests.harness import run_cases, run_ranks
from tests.reference import exact_attention
from tests.speed import scaled
from tokenring_xdit.tools.launch import launch_outcomes

# the ring group's timeout in these launches (ranks inherit the test's slowness: same value)
GROUP_TIMEOUT = 15  # seconds on the reference machine (a rank may start a case late under load)
GROUP_TIMEOUT_S = scaled(GROUP_TIMEOUT)
LAUNCH_TIMEOUT_S = 60  # run_ranks stretches it; the direct launches here do it themselves


def _qkv(torch, *, s=16, kv=24, h=2, d=32, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, s, h, d, generator=gen)
    k = torch.randn(1, kv, h, d, generator=gen)
    v = torch.randn(1, kv, h, d, generator=gen)
    return tuple(x.to(device) for x in (q, k, v))


def _exact(torch, qs, ks, vs, scale=None):
    """fp64 attention of the ranks' shards joined in rank order (tests/reference.py)."""
    joined = (torch.cat(x, dim=1) for x in (qs, ks, vs))
    return exact_attention(*joined, scale=scale)[0]


def _set_timeout(dist, seconds: float) -> None:
    # The launcher's world group has the launch's timeout; shorten it to see bounded waits.
    import datetime

    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=seconds), dist.group.WORLD)


# ---------------------------------------------------------------------------- what must work


def _working(rank, n, group):
    """Several things a user may do that used to hang or abort; each must give exact output."""
    import torch
    import torch.distributed as dist

    from tokenring_xdit.ring import setup_token_ring_group, token_ring_attn

    errors = {}
    # 1. only rank 0 sets the group up; the others create the communicators on first use
    if rank == 0:
        setup_token_ring_group(group)
    q, k, v = _qkv(torch, seed=rank)
    with torch.no_grad():
        out, _ = token_ring_attn(q, k, v, group=group)
    ref = _exact(torch, *zip(*(_qkv(torch, seed=r) for r in range(n)), strict=True))
    errors["setup_on_one_rank"] = (out.double() - ref[:, 16 * rank : 16 * rank + 16]).abs().max()

    # 2. rank 1's query length changes alone, after a good call (no SIGABRT, exact output)
    lens = [16] * n
    lens[1] = 9
    q, k, v = _qkv(torch, s=lens[rank], seed=10 + rank)
    with torch.no_grad():
        out, _ = token_ring_attn(q, k, v, group=group)
    ref = _exact(torch, *zip(*(_qkv(torch, s=lens[r], seed=10 + r) for r in range(n)), strict=True))
    q0 = sum(lens[:rank])
    errors["q_len_changes_alone"] = (out.double() - ref[:, q0 : q0 + lens[rank]]).abs().max()

    # 3. a yunchang ring function from RING_IMPL_DICT with a group yunchang never saw, and an
    #    attn_type whose own kernel does not exist on CPU (TORCH_FLASH: the CPU flash kernel runs)
    import tokenring_xdit

    tokenring_xdit.install()
    from yunchang.hybrid.utils import RING_IMPL_DICT
    from yunchang.kernels import AttnType

    fresh = dist.new_group(list(range(n)))
    q, k, v = _qkv(torch, seed=rank)
    with torch.no_grad():
        out = RING_IMPL_DICT["token_ring"](q, k, v, group=fresh, attn_type=AttnType.TORCH_FLASH)
    ref = _exact(torch, *zip(*(_qkv(torch, seed=r) for r in range(n)), strict=True))
    errors["yunchang_any_group_torch_flash_on_cpu"] = (
        (out.double() - ref[:, 16 * rank : 16 * rank + 16]).abs().max()
    )
    return {name: float(err) for name, err in errors.items()}


@pytest.mark.timeout(200)  # ring 2's first test waits for all its scenarios
@pytest.mark.parametrize("n", [2, 3])
def test_any_group_lazy_setup_and_changing_lengths_work(n):
    results = _scenarios(n)["working"]
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.error}\n{r.trace}"
        for name, err in r.value.items():
            assert err <= 1e-5, f"rank {r.rank} {name}: max err {err}"


# ---------------------------------------------------------------- what must fail on every rank


def _failing(rank, n, group, name):
    import torch
    import torch.distributed as dist

    from tokenring_xdit.ring import token_ring_attn

    q, k, v = _qkv(torch, seed=rank)
    kwargs = {}
    if name == "scale_differs":
        kwargs["softmax_scale"] = 0.125 if rank == 1 else 0.25
    elif name == "bad_after_good":
        with torch.no_grad():
            token_ring_attn(q, k, v, group=group)
        if rank == 1:
            q, k, v = _qkv(torch, h=4, seed=rank)
    elif name == "meta_device":
        if rank == 1:
            q, k, v = (x.to("meta") for x in (q, k, v))
    elif name == "different_group":
        other = dist.new_group(list(range(n)))  # collective: every rank makes it
        if rank == 1:
            group = other
    elif name == "yunchang_attn_type_without_cpu_kernel":
        import tokenring_xdit

        tokenring_xdit.install()
        from yunchang.hybrid.utils import RING_IMPL_DICT
        from yunchang.kernels import AttnType

        with torch.no_grad():
            return RING_IMPL_DICT["token_ring"](q, k, v, group=group, attn_type=AttnType.FA3)
    else:
        raise AssertionError(name)
    with torch.no_grad():
        token_ring_attn(q, k, v, group=group, **kwargs)
    return "no error"


def _assert_all_raise(results, error_type, *needles):
    for r in results:
        assert r.error_type == error_type, (
            f"rank {r.rank}: expected {error_type}, got {r.error_type}: {r.error}\n{r.trace}"
        )
        for needle in needles:
            assert needle in r.error, f"rank {r.rank}: {needle!r} not in error: {r.error}"


# (scenario, the error every rank raises, what it must say)
MISMATCHES = [
    ("scale_differs", "ValueError", ["softmax_scale differs across ring ranks", "0.125"]),
    ("bad_after_good", "ValueError", ["head count differs", "rank 0 has 2, rank 1 has 4"]),
    ("meta_device", "ValueError", ["rank(s) [1]", "device type", "meta"]),
    (
        "different_group",  # each rank's own communicators meet, so the check names it
        "ValueError",
        ["different process groups with the same ranks", "same group object"],
    ),
    (
        "yunchang_attn_type_without_cpu_kernel",
        "NotImplementedError",
        ["AttnType.FA3", "AttnType.TORCH_FLASH"],
    ),
]


@pytest.mark.timeout(200)  # ring 2's first test waits for all its scenarios
@pytest.mark.parametrize("name,error_type,needles", MISMATCHES)
def test_mismatch_raises_a_named_error_on_every_rank(name, error_type, needles):
    results = _scenarios(2)[name]
    _assert_all_raise(results, error_type, *needles)
    # every wait is bounded by the group's timeout, not torch's 30 minutes
    assert all(r.seconds < scaled(LAUNCH_TIMEOUT_S - 10) for r in results), results


# ---------------------------------------------------------------------- a peer fails mid-call


def _stay_alive_until_the_others_end(done_dir, n):
    """The failing rank stays alive until every other rank has raised and returned (a mark in
    `done_dir` each), at most past everyone's timeout: its peers must see the failure through
    the ring's own bounded waits, not through its process ending."""
    deadline = time.monotonic() + GROUP_TIMEOUT_S + scaled(4)
    while len(os.listdir(done_dir)) < n - 1 and time.monotonic() < deadline:
        time.sleep(0.05)


def _fault(rank, n, report, mode, done_dir):
    """The last rank fails inside the ring (at its second block kernel): it dies (os._exit) or
    raises and stays alive. Every other rank must raise TokenRingCommError within the timeout."""
    import torch
    import torch.distributed as dist

    from tokenring_xdit.ring import setup_token_ring_group, token_ring_attn
    from tokenring_xdit.ring.kernels import math

    _set_timeout(dist, GROUP_TIMEOUT_S)
    setup_token_ring_group(dist.group.WORLD)
    calls = [0]

    def kernel(q, k, v, scale, layout):
        calls[0] += 1
        if rank == n - 1 and calls[0] == 2:
            if mode == "dies":
                os._exit(17)
            raise RuntimeError("injected failure")
        return math(q, k, v, scale, layout)

    q, k, v = _qkv(torch, seed=rank)
    start = time.monotonic()
    group = dist.group.WORLD
    if mode == "yunchang_skips":  # yunchang's groups carry torch's 30-min default timeout
        import tokenring_xdit

        tokenring_xdit.install()
        from yunchang import set_seq_parallel_pg
        from yunchang.globals import PROCESS_GROUP

        set_seq_parallel_pg(1, n, rank, n)
        group = PROCESS_GROUP.RING_PG
        if rank == n - 1:  # skips the call, stays alive
            _stay_alive_until_the_others_end(done_dir, n)
            return ("injected", "skipped", 0.0, "")
        start = time.monotonic()
    try:
        with torch.no_grad():
            token_ring_attn(q, k, v, kernel=kernel, group=group)
    except RuntimeError as exc:
        if rank == n - 1:  # the failing rank stays alive until the others have raised
            _stay_alive_until_the_others_end(done_dir, n)
            return ("injected", str(exc), 0.0, "")
        first = (type(exc).__name__, str(exc), time.monotonic() - start)
        try:  # the ring is unusable now, and says so plainly
            with torch.no_grad():
                token_ring_attn(q, k, v, kernel=kernel, group=group)
            again = "no error"
        except RuntimeError as exc2:
            again = f"{type(exc2).__name__}: {exc2}"
        open(os.path.join(done_dir, str(rank)), "w").close()
        return (*first, again)
    open(os.path.join(done_dir, str(rank)), "w").close()
    return ("no error", "", time.monotonic() - start, "")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", ["dies", "raises_and_stays"])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_peer_failure_mid_call_is_named_on_every_live_rank(n, mode):
    _assert_named_on_live_ranks(_launch_fault(n, mode), mode)


@pytest.mark.timeout(150)
def test_yunchang_route_is_bounded_by_the_world_timeout():
    """yunchang makes its groups with torch's 30-minute default; a rank that skips the call
    must still cost its peers only the world group's timeout (the user's), then a named error."""
    _assert_named_on_live_ranks(_launch_fault(2, "yunchang_skips"), "yunchang_skips")


def _launch_fault(n, mode):
    with tempfile.TemporaryDirectory(prefix="tokenring-fault-") as done_dir:
        return launch_outcomes(
            _fault,
            n,
            (mode, done_dir),
            timeout=scaled(LAUNCH_TIMEOUT_S),
            env={"OMP_NUM_THREADS": "1"},
        )


def _assert_named_on_live_ranks(outcomes, mode):
    failing = outcomes[-1]
    if mode == "dies":
        assert not failing.ok and failing.failure.error_type == "ProcessDied", failing
    else:
        assert failing.ok and failing.value[0] == "injected", failing
    for o in outcomes[:-1]:
        assert o.ok, f"rank {o.rank}: {o.failure}"
        kind, message, elapsed, again = o.value
        assert kind == "TokenRingCommError", (o.rank, kind, message)
        assert "global rank" in message and "likely causes" in message, message
        if mode != "yunchang_skips":
            assert "step" in message, message
        assert elapsed < GROUP_TIMEOUT_S + scaled(5), (o.rank, elapsed, message)
        assert again.startswith("TokenRingCommError") and "unusable after an earlier" in again
        assert "recover" in again, again


# ------------------------------------------------------------ a call's own deadline

CALL_TIMEOUT_S = 2  # the call's RingConfig.timeout, far below the group's
GROUP_30_S = scaled(30)  # the group's, stretched with the bound below so that they stay apart


def _call_timeout(rank, n):
    """A call with config=RingConfig(timeout=2) on a ring whose groups allow 30 s (GROUP_30_S):
    its check (the peer skips the call) and its lanes (the peer raises inside the ring) give up
    after 2 s, and the failure mark it leaves is the ring's (a later call without the config says
    so)."""
    import torch
    import torch.distributed as dist

    from tokenring_xdit import RingConfig
    from tokenring_xdit.ring import setup_token_ring_group, token_ring_attn
    from tokenring_xdit.ring.kernels import math

    _set_timeout(dist, GROUP_30_S)
    other = dist.new_group(list(range(n)))  # the check's failure marks this ring, not WORLD's
    for group in (dist.group.WORLD, other):
        setup_token_ring_group(group)
    cfg = RingConfig(timeout=CALL_TIMEOUT_S, validate="always")
    q, k, v = _qkv(torch, seed=rank)
    seen = {}

    def attempt(name, **kwargs):
        start = time.monotonic()
        try:
            with torch.no_grad():
                token_ring_attn(q, k, v, config=cfg, **kwargs)
            seen[name] = ("no error", "", time.monotonic() - start)
        except RuntimeError as exc:
            seen[name] = (type(exc).__name__, str(exc), time.monotonic() - start)

    if rank == 0:
        attempt("check", group=other)  # rank 1 never calls on it
    time.sleep(scaled(CALL_TIMEOUT_S + 2))  # rank 0's check has given up

    def kernel(q, k, v, scale, layout):
        if rank == 1:
            time.sleep(scaled(CALL_TIMEOUT_S + 2))  # slower than rank 0's deadline
            raise RuntimeError("injected failure")
        return math(q, k, v, scale, layout)

    attempt("lanes", kernel=kernel)
    try:
        with torch.no_grad():
            token_ring_attn(q, k, v)  # the environment's config: same ring, marked unusable
        seen["again"] = "no error"
    except RuntimeError as exc:
        seen["again"] = str(exc)
    return seen


@pytest.mark.timeout(120)
def test_per_call_timeout_is_honoured():
    results = run_ranks(_call_timeout, 2, timeout=LAUNCH_TIMEOUT_S)
    assert results[0].ok, results[0].trace
    seen = results[0].value
    for name, needle in (("check", "within 2 s"), ("lanes", "deadline (2 s)")):
        kind, message, elapsed = seen[name]
        assert kind == "TokenRingCommError", (name, kind, message)
        assert needle in message, (name, message)
        # the call's 2 s bounds it, not the group's GROUP_30_S
        assert elapsed < GROUP_30_S / 2, (name, elapsed)
    assert "unusable after an earlier failure" in seen["again"], seen["again"]


# ------------------------------------------------- a choice changed under cached agreement


def _switched_choices(rank, n, group):
    """NCCL rings reuse an agreement per signature (TOKENRING_XDIT_VALIDATE=signature here, on
    gloo). Both ranks run both rings in agreement first, so each has a cached agreement for
    either choice; then they switch to different rings. The switch must be seen: one ValueError
    on each rank (xDiT's GPU test hung here: both ranks hit their caches and ran different
    protocols), and after both switch back the call agrees again."""
    import torch

    from tokenring_xdit.hosts import selection

    q = torch.zeros(1, 8, 2, 16)

    def choose():
        return selection.choose(group, q, 8, 8, None, lambda *a: None)

    seen = []
    for impl in (selection.TOKEN_RING, selection.DEFAULT):
        selection.set_xdit_ring_impl(impl)
        seen.append(choose())
    selection.set_xdit_ring_impl(selection.TOKEN_RING if rank == 0 else selection.DEFAULT)
    try:
        seen.append(f"no error: {choose()}")
    except ValueError as exc:
        seen.append(str(exc))
    selection.set_xdit_ring_impl(selection.DEFAULT)
    seen.append(choose())
    return seen


@pytest.mark.timeout(200)  # ring 2's first test waits for all its scenarios
def test_switching_rings_is_seen_under_cached_agreement():
    results = _scenarios(2)["switched_choices"]
    for r in results:
        assert r.ok, (r.rank, r.error_type, r.error, r.trace)
        (tokenring, default), mismatch, after = r.value[:2], r.value[2], r.value[3]
        assert (tokenring, default) == ("token_ring", "default"), r.value
        assert "chose different ring attentions" in mismatch, (r.rank, mismatch)
        assert "rank 0: TokenRing" in mismatch and "rank 1: the host's own ring" in mismatch
        assert after == "default", (r.rank, after)


# --------------------------------------------------------- the scenarios that share a launch


def _scenario(rank, n, group, name):
    if name == "working":
        return _working(rank, n, group)
    if name == "switched_choices":
        return _switched_choices(rank, n, group)
    return _failing(rank, n, group, name)


@functools.cache
def _scenarios(n):
    # switched_choices last: it leaves the process's ring choice at the host's own
    names = ["working", *(m[0] for m in MISMATCHES), "switched_choices"] if n == 2 else ["working"]
    envs = {"switched_choices": {"TOKENRING_XDIT_VALIDATE": "signature"}}
    return run_cases(_scenario, n, names, envs=envs, group_timeout=GROUP_TIMEOUT, timeout=150)
