"""xDiT's real USP (xfuser.model_executor.layers.usp) with TokenRing selected, against exact
attention and against xDiT's own ring, on gloo ranks in CPU mode (fp32).

Every rank sets xDiT up as its pipelines do (world group, engine config parsed by xDiT's own
parser, `initialize_runtime_state` with a tiny pipeline: parallel groups and the SDPA_FLASH
backend), then calls `USP(q, k, v, ...)` on its rows of one global sequence:

- plain: q/k/v (b=2, h=4, 6 rows per SP rank, d=16);
- joint_front / joint_rear: plus 5 joint (text) tokens, joint_query/key/value given; xDiT
  concatenates the joint query to the local query and hands the joint K/V to the ring;
- kv_longer: `usp.ring_attn` itself with local K/V longer than the local Q (4 vs 10 rows per
  ring rank), the shape PipeFusion's KV cache gives the ring, with xDiT's selected kernel.

The reference is fp64 SDPA of each rank's query rows against every rank's K/V plus the joint K/V
(order does not matter to softmax attention). The layouts are ring 2 (world 2), ring 4 and
ulysses 2 x ring 2 (world 4); see launches.py.
"""

from __future__ import annotations

import pytest

from tests.xdit import workers
from tests.xdit.launches import CPU_MODE_MARKS, FP32_TOL, LAYOUTS, cpu_launch, max_err, part

pytestmark = CPU_MODE_MARKS
# one pytest-xdist worker for every file that reads cpu_launch (tests/xdist_scopes.py)
XDIST_SCOPE = "tests/xdit/launches.py"


def _errors(layout: str, impl: str, case: str) -> dict[int, float]:
    errors = {}
    for result in cpu_launch(layout):
        usp = part(result, "usp")
        ref = workers.expected_rows(case, usp["sp"], usp["ring"], usp["sp_rank"], usp["ring_rank"])
        errors[result["rank"]] = max_err(usp[f"{impl}/{case}"]["out"], ref)
    return errors


@pytest.mark.parametrize("case", workers.USP_CASES)
@pytest.mark.parametrize("impl", [workers.TOKEN_RING, workers.DEFAULT])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_usp_matches_exact_attention(layout: str, impl: str, case: str) -> None:
    errors = _errors(layout, impl, case)
    worst = max(errors.values())
    print(f"{layout} {impl} {case}: max |USP - exact| = {worst:.2e} (per rank {errors})")
    assert worst <= FP32_TOL, f"{layout} {impl} {case}: max |err| {worst:.3e} > {FP32_TOL}"


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_token_ring_ran_and_default_did_not(layout: str) -> None:
    """Per call and rank: TokenRing's entry point once, one kernel per ring step, N-1 Q messages
    and N-1 returned partials (out + lse), never xDiT's torch ring; the other way round for
    xDiT's own ring. The ring's local query length shows xDiT's ulysses all-to-all and its
    concatenation of the joint query (u * (local + joint) rows)."""
    ulysses, ring = LAYOUTS[layout]
    q_lens = {
        "plain": ulysses * workers.LOCAL,
        "joint_front": ulysses * (workers.LOCAL + workers.JOINT),
        "joint_rear": ulysses * (workers.LOCAL + workers.JOINT),
        "kv_longer": workers.KV_Q,
    }
    for result in cpu_launch(layout):
        usp = part(result, "usp")
        assert result["backend"] == "SDPA_FLASH"
        for case in workers.USP_CASES:
            got = usp[f"{workers.TOKEN_RING}/{case}"]
            counts = {k: got[k] for k in got if k != "out"}
            expected = dict(
                usp_ring_attn=1,
                usp_ring_attn_joint=int(case.startswith("joint")),
                templated_ring=0,
                kernel_calls=ring,
                q_messages=ring - 1,
                partial_messages=2 * (ring - 1),
                ring_q_lens=[q_lens[case]],
                kv_cache_steps=0,  # USP called without attn_layer: no K/V cache step
            )
            assert counts == expected, (result["rank"], case, counts)
            got = usp[f"{workers.DEFAULT}/{case}"]
            counts = {k: got[k] for k in ("usp_ring_attn", "templated_ring", "kernel_calls")}
            assert counts == dict(usp_ring_attn=0, templated_ring=1, kernel_calls=0), (
                result["rank"],
                case,
                counts,
            )


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_token_ring_agrees_with_xdit_ring(layout: str) -> None:
    worst = 0.0
    for result in cpu_launch(layout):
        usp = part(result, "usp")
        for case in workers.USP_CASES:
            a = usp[f"{workers.TOKEN_RING}/{case}"]["out"]
            b = usp[f"{workers.DEFAULT}/{case}"]["out"]
            worst = max(worst, max_err(a, b))
    print(f"{layout}: max |TokenRing - xDiT ring| over all cases = {worst:.2e}")
    assert worst <= FP32_TOL, f"{layout}: max |TokenRing - xDiT ring| {worst:.3e} > {FP32_TOL}"


def test_ring_ranks_that_choose_different_rings_fail_together() -> None:
    """One ring rank selects TokenRing, the other xDiT's ring: the same ValueError on every
    rank before either ring moves data; the next call, agreed again, is exact."""
    for layout in LAYOUTS:
        for result in cpu_launch(layout):
            usp = part(result, "usp")
            assert "chose different ring attentions" in usp["mismatch"], usp["mismatch"]
            assert "rank 1: the host's own ring" in usp["mismatch"], usp["mismatch"]
            sp, ring, sp_rank, ring_rank = (usp[n] for n in ("sp", "ring", "sp_rank", "ring_rank"))
            ref = workers.expected_rows("plain", sp, ring, sp_rank, ring_rank)
            assert max_err(usp["after_mismatch"], ref) <= FP32_TOL
