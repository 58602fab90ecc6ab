"""A call's config reaches the communicators it makes (the communicator scope of RingConfig).

`token_ring_attn(..., config=RingConfig(comm_high_priority=True, timeout=...))` on a group that
has no communicators yet makes them with those settings (they travel as `CommSettings` through
the agreement to communicator creation), and its timeout bounds that call's waits; a group whose
first call passes nothing gets the environment's. Real gloo process groups, two ranks.
"""

from __future__ import annotations

from tests.harness import run_ranks, values

LAUNCH_TIMEOUT = 90  # seconds; also the gloo timeout of the launch


def _made_with(rank, n):
    import torch
    import torch.distributed as dist

    from tokenring_xdit.config import CommSettings, RingConfig
    from tokenring_xdit.ring import token_ring_attn
    from tokenring_xdit.ring.comm import comms_of, group_timeout, teardown

    passed = dist.new_group(list(range(n)))
    plain = dist.new_group(list(range(n)))
    gen = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(1, 8, 2, 16, generator=gen) for _ in range(3))
    with torch.no_grad():
        token_ring_attn(q, k, v, group=passed, config=RingConfig(comm_high_priority=True,
                                                                  timeout=17.0))  # fmt: skip
        token_ring_attn(q, k, v, group=plain)  # the environment's: TOKENRING_XDIT_TIMEOUT
        # a later call's timeout bounds its own waits on the communicators made before
        token_ring_attn(q, k, v, group=plain, config=RingConfig(timeout=5.0))

    def seconds(g) -> float:
        return group_timeout(g).total_seconds()

    report = {}
    for name, group in (("passed", passed), ("plain", plain)):
        comms = comms_of(group)
        report[name] = dict(
            settings=comms.settings == CommSettings(*_expected(name)),
            deadline=comms.deadline.total_seconds(),
            check=seconds(comms.check),  # a real gloo communicator, made with the deadline
            out=seconds(comms.out),
        )
    views = teardown.LIVE.views.get(comms_of(plain), {})
    report["per_call"] = sorted(s for s in views if views[s].deadline.total_seconds() == s)
    return report


def _expected(name: str) -> tuple:
    return (True, 17.0) if name == "passed" else (False, 40.0)


def test_a_passed_config_reaches_communicator_creation():
    results = run_ranks(_made_with, 2, timeout=LAUNCH_TIMEOUT, env={"TOKENRING_XDIT_TIMEOUT": "40"})
    for report in values(results):
        assert report["passed"] == dict(settings=True, deadline=17.0, check=17.0, out=17.0)
        assert report["plain"] == dict(settings=True, deadline=40.0, check=40.0, out=40.0)
        assert report["per_call"] == [5.0, 40.0]  # this call's, and the environment's
