"""`tokenring-xdit compare --host diffusers`, end to end on CPU (real diffusers, real ranks).

One command: tiny random-weight Flux.1, 64 x 64 px, 3 steps, fp32, 2 gloo ranks; plain diffusers
in one process, then diffusers' own context parallelism (`enable_parallelism(config=
ContextParallelConfig(ring_degree=2))`, backend `_native_flash` through the CPU shims) with its
ring and with TokenRing. Checked: exit code 0, the compare command's float32 thresholds
(PSNR >= 60 dB, max |pixel diff| <= 1/255, latent rel. diff <= 1e-4) for TokenRing vs diffusers'
ring and vs the single process, and which ring each run took (TokenRing's calls from
`tokenring_xdit.calls_by_host()`, diffusers' ring's from its `TemplatedRingAttention`). 64 px
keeps the three launches (mostly imports) to about 30 s on 2 idle cores.
"""

from __future__ import annotations

import json

import pytest

from tokenring_xdit.tools import cli, compare

STEPS = 3
PX = 64
ARGV = ["--host", "diffusers", "--device", "cpu", "--dtype", "float32", "--nproc", "2"]
ARGV += ["--height", str(PX), "--steps", str(STEPS), "--warmup-steps", "0", "--no-progress"]
# Flux tiny: one double-stream and one single-stream block, one ring call each per step
RING_CALLS = 2 * STEPS


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[int, dict]:
    """(exit code, JSON report) of the one command."""
    out = tmp_path_factory.mktemp("compare-diffusers")
    code = cli.main(["compare", *ARGV, "--out", str(out)])
    report = json.loads((out / "flux-tiny-diffusers-compare.json").read_text())
    return code, report


def test_passes_with_exit_0(run) -> None:
    code, report = run
    assert code == compare.EXIT_OK, report["comparisons"]
    assert report["passed"] and report["path_problems"] == []
    cfg = report["config"]
    assert (cfg["host"], cfg["model"], cfg["ring"], cfg["height"]) == ("diffusers", "flux", 2, PX)
    assert report["command"].startswith("tokenring-xdit compare --model flux --size tiny --host")


@pytest.mark.parametrize("reference", ["ring", "single"])
def test_token_ring_meets_the_float32_thresholds(run, reference: str) -> None:
    _, report = run
    by_pair = {(c["test"], c["reference"]): c for c in report["comparisons"]}
    c = by_pair[("token_ring", reference)]
    print(
        f"TokenRing vs {reference}: PSNR {c['psnr_db']} dB, SSIM {c['ssim']:.6f}, "
        f"max |diff| {c['max_abs_diff']:.2e}, latent rel. {c['latent_rel_diff']:.2e}"
    )
    assert c["checked"] and c["failures"] == []
    assert c["psnr_db"] == "inf" or c["psnr_db"] >= 60.0
    assert c["max_abs_diff"] <= 1 / 255 and c["latent_rel_diff"] <= 1e-4


def test_each_run_took_its_ring(run) -> None:
    """Every rank of the TokenRing run called TokenRing for every attention (and never diffusers'
    ring); the ring run the other way round. A silent fall-back would compare a ring with
    itself."""
    _, report = run
    runs = report["runs"]
    for rank, calls in enumerate(runs["token_ring"]["ring_calls_per_rank"]):
        assert calls == {"token_ring": RING_CALLS, "diffusers_ring": 0}, (rank, calls)
    for rank, calls in enumerate(runs["ring"]["ring_calls_per_rank"]):
        assert calls == {"token_ring": 0, "diffusers_ring": RING_CALLS}, (rank, calls)
    assert runs["token_ring"]["selected"][0] == "token_ring"
    assert runs["ring"]["selected"][0] == "default"
    assert runs["ring"]["attention_backend"] == "_native_flash"


def test_image_is_not_degenerate(run) -> None:
    """A flat or saturated image would make any comparison pass."""
    stats = run[1]["runs"]["single"]["image_stats"]
    assert stats["std"] > 0.05 and stats["saturated_fraction"] < 0.1
