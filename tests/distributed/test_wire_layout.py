"""The wire layout: Q and partials travel with seq and heads swapped where q is stored that way.

xDiT hands the ring (b, h, s, d) views of (b, s, h, d) projections. Moving Q in its storage
order saves a copy of q per call, and an output in the same order saves xDiT's copy after the
call. The order is voted in the agreement (ring/layout.storage, wire_swapped): a rank that stores
q as declared keeps every rank on the declared layout; a cached agreement stays right when one
rank's strides change alone (each rank views or copies its q into the agreed layout). Every case
is compared with exact fp64 attention over the whole sequence; one launch per ring size.
"""

from __future__ import annotations

import functools

import pytest

from tests.harness import run_ranks, values
from tests.reference import exact_attention

Q_LENS, KV_LENS = [19, 26, 13], [21, 17, 30]
TOL = 1e-5

# name -> how each rank stores its (b, h, s, d) q: "swapped" (a view of (b, s, h, d)), "declared"
# (contiguous), "either" (a slice along d of a bigger tensor: neither order is dense)
CASES = {
    "all-swapped": ("swapped", "swapped", "swapped"),
    "one-declared": ("swapped", "declared", "swapped"),
    "swapped-and-either": ("either", "swapped", "either"),
    "all-declared": ("declared", "declared", "declared"),
}
WIRE_SWAPPED = {"all-swapped": True, "one-declared": False, "swapped-and-either": True,
                "all-declared": False}  # fmt: skip


def _stored(torch, x, how):
    """x (b, h, s, d), equal values, stored as `how`."""
    if how == "swapped":
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    if how == "either":
        return torch.cat([x, x], dim=3)[..., : x.shape[3]]
    return x.contiguous()


def _worker(rank, n):
    import torch
    import torch.distributed as dist

    from tokenring_xdit import config
    from tokenring_xdit.ring import COUNTERS, setup_token_ring_group, token_ring_attn

    setup_token_ring_group(dist.group.WORLD)
    b, h, d = 2, 3, 40
    gen = torch.Generator().manual_seed(5)
    q_lens, kv_lens = Q_LENS[:n], KV_LENS[:n]
    gq = torch.randn(b, h, sum(q_lens), d, generator=gen, dtype=torch.float64)
    gk, gv = (torch.randn(b, h, sum(kv_lens), d, generator=gen, dtype=torch.float64) for _ in "kv")
    joint = tuple(torch.randn(b, h, 5, d, generator=gen, dtype=torch.float64) for _ in "kv")
    q0, k0 = sum(q_lens[:rank]), sum(kv_lens[:rank])
    qs, ks = slice(q0, q0 + q_lens[rank]), slice(k0, k0 + kv_lens[rank])
    ref = {}
    for with_joint in (False, True):
        keys = [gk, joint[0]] if with_joint else [gk]
        vals = [gv, joint[1]] if with_joint else [gv]
        out, lse = exact_attention(
            gq, torch.cat(keys, dim=2), torch.cat(vals, dim=2), layout="bhsd"
        )
        ref[with_joint] = out[:, :, qs], lse[:, :, qs]
    q, k, v = gq[:, :, qs].float(), gk[:, :, ks].float(), gv[:, :, ks].float()
    fp32_joint = tuple(x.float() for x in joint)

    def call(q_in, with_joint=False, cfg=None):
        extra = dict(joint_kv=fp32_joint, joint_strategy="rear") if with_joint else {}
        with torch.no_grad():
            out, lse = token_ring_attn(
                q_in, k, v, group=dist.group.WORLD, layout="bhsd", config=cfg, **extra
            )
        want_out, want_lse = ref[with_joint]
        return dict(
            err=max(
                (out.double() - want_out).abs().max().item(),
                (lse.double() - want_lse).abs().max().item(),
            ),  # fmt: skip
            out_swapped=out.transpose(1, 2).is_contiguous() and not out.is_contiguous(),
            q_intact=torch.equal(q_in, q),
        )

    results = {}
    always = config.current().replace(validate="always")
    for name, storage in CASES.items():
        for with_joint in (False, True):
            results[name, with_joint] = call(_stored(torch, q, storage[rank]), with_joint, always)
    # The signature cache (NCCL's default): agreed once with every q swapped, then rank 0 alone
    # stores its q as declared; the cached ring (wire swapped) must stay exact without a check.
    cached = config.current().replace(validate="signature")
    call(_stored(torch, q, "swapped"), cfg=cached)
    COUNTERS.reset()
    results["cache"] = call(_stored(torch, q, "declared" if rank == 0 else "swapped"), cfg=cached)
    results["cache"]["handshakes"] = COUNTERS.handshakes
    return results


@functools.cache
def _results(n: int):
    return values(run_ranks(_worker, n, timeout=150))


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("with_joint", [False, True])
def test_every_storage_mix_is_exact_and_votes_the_wire(n, name, with_joint):
    for rank, got in enumerate(_results(n)):
        res = got[name, with_joint]
        assert res["err"] <= TOL, (rank, res)
        assert res["q_intact"], rank
        # the output follows the wire: swapped storage exactly where the vote swapped it
        assert res["out_swapped"] == WIRE_SWAPPED[name], (rank, res)


@pytest.mark.parametrize("n", [2, 3])
def test_cached_agreement_survives_one_rank_changing_storage(n):
    for rank, got in enumerate(_results(n)):
        res = got["cache"]
        assert res["handshakes"] == 0, (rank, res)  # nobody went back into the exchange
        assert res["err"] <= TOL, (rank, res)
        assert res["out_swapped"], (rank, res)  # the cached wire layout, on every rank
