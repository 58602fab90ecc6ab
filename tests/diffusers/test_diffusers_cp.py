"""diffusers' own context parallelism (`enable_parallelism`) with TokenRing as its ring, on real
gloo ranks: tiny random Flux and Wan transformers and a tiny Flux pipeline, no download, fp32.

Each world size is launched once (a module-scoped fixture); the tests read its results. Every
rank compares TokenRing and diffusers' own ring with one process, and counts TokenRing's calls
with `tokenring_xdit.calls_by_host()`. Workers: tests/diffusers/workers.py.
"""

from __future__ import annotations

import pytest

from tests.diffusers import workers
from tests.harness import run_ranks, values

TOL = 1e-5  # fp32, max |err| on the transformer output


def _launch(fn, world_size: int) -> list[dict]:
    return values(run_ranks(fn, world_size, env=workers.ENV, timeout=240))


@pytest.fixture(scope="module")
def ring2() -> list[dict]:
    return _launch(workers.ring2, 2)


def _assert_matches(result: dict, calls: int) -> None:
    assert result["token_ring"] <= TOL, result
    assert result["diffusers_ring"] <= TOL, result
    assert result["token_ring_vs_diffusers"] <= TOL, result
    assert result["calls"] == calls, result  # one TokenRing forward per CP attention layer
    assert result["calls_with_diffusers_ring"] == 0, result


@pytest.mark.parametrize("model, calls", [("flux", 2), ("wan", 1)])
def test_ring2_matches_one_process_and_diffusers_ring(ring2, model, calls):
    for result in ring2:
        _assert_matches(result[model], calls)


def test_ring2_pipeline_image(ring2):
    for result in ring2:
        assert result["pipeline"]["psnr_db"] >= 60.0, result["pipeline"]
        assert result["pipeline"]["calls"] == 4  # 2 steps x 2 attention layers


def test_ranks_that_choose_different_rings_fail_together(ring2):
    """No abort, no two rings meeting on one group: the same ValueError on every rank, naming
    each rank's choice, and the model works again once the ranks agree."""
    for result in ring2:
        got = result["mismatch"]
        for case in ("switch", "auto_grad"):
            assert "chose different ring attentions" in got[case], (case, got[case])
        assert "rank 0: TokenRing, chosen by set_xdit_ring_impl()" in got["switch"], got
        assert "rank 1: the host's own ring" in got["switch"], got
        assert "rank 0: auto" in got["auto_grad"] and "requires_grad" in got["auto_grad"], got
        assert got["after_finite"], got


def test_training_through_diffusers_ring_matches_one_process(ring2):
    for result in ring2:
        grads = result["grads"]
        assert grads["calls"] > 0, grads  # TokenRing ran the forward
        assert grads["loss_err"] <= 1e-6 and grads["grad_rel_err"] <= 1e-4, grads


def test_cpu_mode_backward_through_diffusers_ring_is_a_clear_error(ring2):
    for result in ring2:
        msg = result["their_ring_grad_error"]
        assert "forward-only" in msg and "TOKENRING_XDIT_RING_IMPL=token_ring" in msg, msg


def test_refusals_on_every_rank(ring2):
    for result in ring2:
        no_lse = result["no_lse_error"]
        assert "'native'" in no_lse and "log-sum-exp" in no_lse, no_lse
        assert "_native_cudnn" in no_lse and "_native_flash" in no_lse, no_lse


def test_selected_after_enable_parallelism_works(ring2):
    for result in ring2:
        late = result["late_selection"]
        assert late["calls"] > 0 and late["max_err"] <= 1e-5, late


def test_rank0_says_once_which_ring_runs(ring2):
    assert sorted(ring2[0]["log"]) == [
        "context-parallel ring attention: TokenRing (tokenring_xdit), selected by "
        "set_xdit_ring_impl()",
        "context-parallel ring attention: diffusers' own, selected by set_xdit_ring_impl()",
    ]
    assert ring2[1]["log"] == []


def test_uninstall_restores_diffusers_ring(ring2):
    for result in ring2:
        assert result["uninstall"] == dict(
            calls=0, same_as_diffusers_ring=True, restored=True, installed=[]
        )


def test_ring3_even_and_ring_anything():
    for result in _launch(workers.ring3, 3):
        _assert_matches(result["even"], 2)
        uneven = result["ring_anything"]
        _assert_matches(uneven, 2)
        # the same model, other lengths, one rank's shard unchanged: no stale handshake, no hang
        assert uneven["new_lengths"] <= TOL and uneven["new_lengths_calls"] == 2, uneven


def test_ulysses2_ring2():
    for result in _launch(workers.ulysses2_ring2, 4):
        _assert_matches(result, 2)


def test_auto_with_uneven_shards_runs_token_ring_and_logs_once(ring2):
    results = [result["auto_ring_anything"] for result in ring2]
    for result in results:
        assert result["max_err"] <= TOL and result["calls"] == 4, result  # 2 layers x 2 calls
    lines = results[0]["log"]
    # both layers share one signature; 19 tokens on the longer shard, so "38 tokens" on rank 0
    # and rank 1 alike (rank 1 holds 18)
    assert lines == [
        "context-parallel ring attention: auto -> TokenRing for 4x8, 38 tokens, ring 2 "
        "(cpu: no calibration to predict from, TokenRing by rule)"
    ], lines
    assert results[1]["log"] == []
