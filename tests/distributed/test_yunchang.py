"""yunchang's real LongContextAttention with ring_impl_type="token_ring", ulysses 2 x ring 2.

Every rank builds the same global q/k/v, shards them with yunchang's EXTRACT_FUNC_DICT, runs the
hybrid layer, and compares its shard with exact single-process attention and with yunchang's own
basic P2P ring (run with a CPU kernel that returns a real lse through yunchang's attn_processor
hook, since no yunchang AttnType has one on CPU).
"""

from __future__ import annotations

import torch

from tests.harness import run_ranks, values
from tests.reference import exact_attention


def _cpu_processor(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, **_):
    """yunchang fwd-only kernel contract, (b, s, h, d) -> (out, lse (b, h, s) fp32)."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        *(x.transpose(1, 2) for x in (q, k, v)), dropout_p, causal, scale=softmax_scale
    )[:2]
    return out.transpose(1, 2), lse


def _hybrid_worker(rank, world_size, ulysses, ring, use_low):
    import tokenring_xdit

    tokenring_xdit.install()
    import yunchang
    from yunchang import EXTRACT_FUNC_DICT, LongContextAttention, set_seq_parallel_pg
    from yunchang.hybrid import LongContextAttentionQKVPacked
    from yunchang.kernels import AttnType

    from tokenring_xdit.ring.comm import COUNTERS

    set_seq_parallel_pg(ulysses, ring, rank, world_size, use_ulysses_low=use_low)
    errors = {}
    gen = torch.Generator().manual_seed(1234)
    b, s, h, d = 2, 16 * world_size, 2 * ulysses, 72
    q, k, v = (torch.randn(b, s, h, d, generator=gen) for _ in range(3))
    ref = exact_attention(q, k, v)[0]  # full sequence, fp64, (b, s, h, d)

    def shard(x):
        return EXTRACT_FUNC_DICT["token_ring"](x, rank, world_size=world_size, rd=ring, ud=ulysses)

    local_ref = shard(ref)
    with torch.no_grad():
        outs = {}
        for name, impl, attn_type, proc in [
            ("token_ring/TORCH_MATH", "token_ring", AttnType.TORCH_MATH, None),
            ("token_ring/processor", "token_ring", None, _cpu_processor),
            ("basic/processor", "basic", None, _cpu_processor),
        ]:
            layer = LongContextAttention(
                ring_impl_type=impl, attn_type=attn_type, attn_processor=proc
            )
            COUNTERS.reset()
            outs[name] = layer(shard(q), shard(k), shard(v))
            errors[name] = (outs[name].double() - local_ref).abs().max().item()
            if impl == "token_ring":
                errors[name + ":kernel_calls"] = COUNTERS.kernel_calls
        errors["token_ring vs basic"] = (
            (outs["token_ring/TORCH_MATH"] - outs["basic/processor"]).abs().max().item()
        )
        packed = LongContextAttentionQKVPacked(
            ring_impl_type="token_ring", attn_type=AttnType.TORCH_MATH
        )
        qkv = torch.stack([shard(q), shard(k), shard(v)], dim=2)
        errors["token_ring/qkvpacked"] = (packed(qkv).double() - local_ref).abs().max().item()
        assert yunchang.RING_IMPL_QKVPACKED_DICT["token_ring"] is not None
    return errors


def _check(results, ring):
    for rank, errs in enumerate(values(results)):
        for name, err in errs.items():
            if name.endswith(":kernel_calls"):
                # final_chunks defaults to 1 at these lengths: one kernel per ring step
                assert err == ring, f"rank {rank} {name}: {err} kernel calls for ring {ring}"
            else:
                assert err <= 1e-5, f"rank {rank} {name}: max |err| {err:.3e} > 1e-5"


def test_ulysses2_ring2_token_ring_matches_exact_and_basic():
    _check(run_ranks(_hybrid_worker, 4, 2, 2, True), ring=2)


def test_ring4_and_ulysses_high_layout():
    _check(run_ranks(_hybrid_worker, 4, 1, 4, True), ring=4)
    _check(run_ranks(_hybrid_worker, 4, 2, 2, False), ring=2)


def _unknown_impl_worker(rank, world_size):
    import tokenring_xdit

    tokenring_xdit.install()
    from yunchang import LongContextAttention, set_seq_parallel_pg

    set_seq_parallel_pg(1, world_size, rank, world_size)
    LongContextAttention(ring_impl_type="tokenring")


def test_unknown_ring_impl_type_is_a_clear_error_on_every_rank():
    results = run_ranks(_unknown_impl_worker, 2, timeout=90)
    for r in results:
        assert r.error_type == "UnknownRingImplError", r
        assert "unknown ring_impl_type 'tokenring'" in r.error and "token_ring" in r.error, r.error
