"""benchmarks/train_sweep.py --ulysses: the USP layers it builds, 4 gloo ranks (ulysses 2 x ring 2).

Every rank builds the script's own methods (`_impls(4, 2, "cpu")`: yunchang's LongContextAttention
with ring_impl_type "token_ring", "basic" and "zigzag" over set_seq_parallel_pg(2, 2), yunchang's
rings on TokenRing's CPU flash pair as the script wires them without flash-attn) and runs the
script's `_check` (forward + backward, each method on the shards `_shard_for` gives it) against
fp64 attention of the whole sequence. The shards themselves are compared with an independent
formula (tests/reference.py's zigzag slice of the ring, split over ulysses). torch's templated ring
and ulysses-N are left out on CPU (see the script's docstring); what the script puts around torch's
ring (its device mesh, the all-to-alls) is checked with TokenRing's functional ring inside. The GPU
run (`--ulysses 2 --check`) checks torch's ring itself.
"""

from __future__ import annotations

import torch

from tests.harness import run_ranks, values
from tests.reference import zigzag_slice

N, U = 4, 2
METHODS = ("token_ring", "yunchang_zigzag", "yunchang_basic")
# bf16 inputs (yunchang's rings are bf16-only, see the script), fp64 reference on the same inputs
BF16_TOL = {"out": 2e-2, "dq": 6e-2, "dk": 6e-2, "dv": 6e-2}
FP32_TOL = 2e-5


def _worker(rank, world_size):
    import tokenring_xdit
    from benchmarks import train_sweep as ts
    from tokenring_xdit.ring.comm import setup_token_ring_group

    tokenring_xdit.install()
    setup_token_ring_group(None)  # as the script does for the world group
    impls = ts._impls(world_size, U, "cpu")
    b, s, h, d = 2, 32 * world_size, 4, 32
    errs, layout_ok = {}, {}
    x = torch.arange(s).reshape(1, s, 1).expand(b, s, h).clone()  # token positions
    problems = {
        (causal, dtype): ts._reference(b, s, h, d, causal, "cpu", dtype)
        for causal in (True, False)
        for dtype in (torch.bfloat16, torch.float32)
    }
    for causal in (True, False):
        tag = "causal" if causal else "full"
        for name in METHODS:
            shard = ts._shard_for(name, causal, rank, world_size, U)
            problem = problems[causal, torch.bfloat16]
            errs[f"{tag}/{name}"] = ts._check(impls[name], shard, problem, causal)
            if causal and name != "yunchang_basic":  # ring rank // U: its zigzag, ulysses part
                want = zigzag_slice(x, rank // U, world_size // U).chunk(U, dim=1)[rank % U]
            else:
                want = x.chunk(world_size, dim=1)[rank]
            layout_ok[f"{tag}/{name}"] = torch.equal(shard(x), want)
        # TokenRing is exact in fp32 too (yunchang's rings are not: dq aliases a buffer)
        shard = ts._shard_for("token_ring", causal, rank, world_size, U)
        fn = impls["token_ring"]
        errs[f"{tag}/token_ring/fp32"] = ts._check(
            fn, shard, problems[causal, torch.float32], causal
        )
    # torch's templated ring runs CUDA-only kernels; what the script wraps around it is checked
    # here with TokenRing's functional ring as the inner ring: the mesh is yunchang's ring group,
    # the all-to-alls are LongContextAttention's
    import torch.distributed as dist
    from yunchang.globals import PROCESS_GROUP

    from tokenring_xdit import make_split
    from tokenring_xdit.ring import token_ring_attn_func

    ring_pg = ts._ring_mesh(world_size, U, "cpu").get_group()
    same_ring = dist.get_process_group_ranks(ring_pg) == dist.get_process_group_ranks(
        PROCESS_GROUP.RING_PG
    )

    def inner(q, k, v, causal):
        n = world_size // U  # the ring's size: its shards are the zigzag split's
        split = make_split(q.shape[1] * n, n, causal=True) if causal else None
        return token_ring_attn_func(q, k, v, causal=causal, group=ring_pg, split=split)

    wrapped = ts._behind_all_to_all(inner, PROCESS_GROUP.ULYSSES_PG)
    for causal in (True, False):
        shard = ts._shard_for("torch_templated_ring", causal, rank, world_size, U)
        key = f"{'causal' if causal else 'full'}/behind_all_to_all/fp32"
        errs[key] = ts._check(wrapped, shard, problems[causal, torch.float32], causal)
    return {
        "errs": errs,
        "layout_ok": layout_ok,
        "methods": sorted(impls),
        "same_ring": same_ring,
    }


def test_usp_methods_match_exact_attention():
    results = values(run_ranks(_worker, N, timeout=240))
    failures = []
    for rank, res in enumerate(results):
        assert res["methods"] == sorted(METHODS), res["methods"]
        assert res["same_ring"], f"rank {rank}: the torch ring's mesh is not yunchang's ring group"
        for key, ok in res["layout_ok"].items():
            if not ok:
                failures.append(f"rank {rank} {key}: shard is not the hybrid layout")
        for key, errs in res["errs"].items():
            for what, err in errs.items():
                tol = FP32_TOL if key.endswith("fp32") else BF16_TOL[what]
                if not err <= tol:
                    failures.append(f"rank {rank} {key} {what}: {err:.3g} > {tol}")
    assert not failures, "\n".join(failures)
    worst = {
        k: max(r["errs"][k][w] for r in results for w in r["errs"][k]) for k in results[0]["errs"]
    }
    print("max errors:", {k: f"{v:.2e}" for k, v in worst.items()})
