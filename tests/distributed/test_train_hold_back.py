"""The own block held back in part (TOKENRING_XDIT_TRAIN_HOLD_BACK=1, ring/training/hold_back.py) on real
gloo ranks, through the public API: test_training's case matrix (causal zigzag and non-causal,
uneven shards, bshd/bhsd, fp32/bf16, the qkv-packed call) and test_packed_documents' random
packed documents, each vs exact fp64, with the option switched on in every rank's environment.

Counts: the transfers are those of the loop without the split; the kernel calls per pass are
N + 1 (step 0 runs the own block on its first heads, the return-only row on the rest), N for
a single K/V head (no split). Packed documents keep their own per-step segments (no split):
their kernel calls stay the plan's.
"""

from __future__ import annotations

import functools

import pytest

from tests.distributed import test_packed_documents as docs
from tests.distributed import test_training as train
from tests.harness import run_ranks, values

DOC_CASES = 3  # random packed layouts per ring size (test_packed_documents runs 30 without it)


def _rank(rank: int, n: int) -> dict:
    import os

    import torch
    import torch.distributed as dist

    from tokenring_xdit.ring.comm import setup_token_ring_group
    from tokenring_xdit.ring.packed import document_work

    os.environ["TOKENRING_XDIT_TRAIN_HOLD_BACK"] = "1"  # config.current() re-reads it
    setup_token_ring_group(dist.group.WORLD)
    dense = {c["name"]: train._run_case(c, rank, n, torch) for c in train.CASES}
    packed = []
    for i in range(DOC_CASES):
        c = docs._draw(n, i)
        res = docs._case(rank, n, c)
        res["plan_kernels"] = document_work(c["cu"], n, causal=c["causal"])["ranks"][rank][
            "kernel_calls"
        ]
        packed.append(res)
    return {"dense": dense, "packed": packed}


@functools.cache
def _launch(n: int) -> list:
    return values(run_ranks(_rank, n, timeout=300))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_held_back_matches_exact_attention(n):
    failures = []
    for rank, res in enumerate(_launch(n)):
        for case in train.CASES:
            got = res["dense"][case["name"]]
            assert got["dtype_ok"], case["name"]
            for what, err in got["errs"].items():
                tol = train.FP32_TOL if case["dtype"] == "float32" else train.BF16_TOL[what]
                if not err <= tol:
                    failures.append(f"N={n} rank {rank} {case['name']} {what}: {err:.3g} > {tol}")
        for i, case in enumerate(res["packed"]):
            for what, err in case["errs"].items():
                if not err <= docs.TOL:
                    failures.append(f"N={n} rank {rank} documents {i} {what}: {err:.3g}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_held_back_moves_the_same_and_runs_its_pieces(n):
    """Same transfers as without the split; kernel calls N + 1 per pass (the own block in two
    head pieces), N with one K/V head (nothing to split)."""
    for rank, res in enumerate(_launch(n)):
        for case in train.CASES:
            got = res["dense"][case["name"]]
            extra = 1 if case["h"] > 1 else 0
            for pass_, q_per, ret_per in (("fwd", 1, 2), ("bwd", 4, 1)):
                c = got[pass_]
                where = f"N={n} rank {rank} {case['name']} {pass_}"
                assert c["q_messages"] == q_per * (n - 1), (where, c)
                assert c["partial_messages"] == ret_per * (n - 1), (where, c)
                assert c["kernel_calls"] == n + extra, (where, c)
                assert rank not in c["by_peer"], (where, "self-send", c["by_peer"])
        for case in res["packed"]:
            assert case["kernels"] == case["plan_kernels"]
