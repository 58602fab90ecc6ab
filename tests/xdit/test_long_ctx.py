"""xDiT's legacy `xFuserLongContextAttention` with TokenRing, on gloo ranks in CPU mode (fp32).

CPU mode builds the class on yunchang's LongContextAttention (as on CUDA). Layer inputs are
(b, s, h, d): each rank passes its rows of one global sequence; with joint tensors the layer
concatenates the joint query before ("front") or after ("rear") the local query, so each rank's
output is (b, local + joint, h, d) in that order, and hands the joint K/V (its ulysses heads) to
the ring function. The reference is fp64 SDPA of those query rows against every rank's K/V plus
the joint K/V. Layouts: ring 2, ring 4, ulysses 2 x ring 2 (the launches of launches.py).

Cases: ring_impl_type="token_ring" (plain, joint front/rear, attn_type TORCH_MATH, and
use_kv_cache=True, which xDiT refused for any ring but "basic", without and with the module's
entry in xDiT's cache manager), and ring_impl_type left at "basic" with TokenRing selected
globally. Not selected and "basic", the layer keeps xDiT's own ring function; Sana's linear
attention layer keeps its own ring even when TokenRing is selected.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.speed import scaled
from tests.xdit import workers
from tests.xdit.launches import CPU_MODE_MARKS, FP32_TOL, LAYOUTS, cpu_launch, max_err, part

pytestmark = CPU_MODE_MARKS
# one pytest-xdist worker for every file that reads cpu_launch (tests/xdist_scopes.py)
XDIST_SCOPE = "tests/xdit/launches.py"


def _reference_case(case: str) -> str:
    return case.split("/")[1] if "joint" in case else "plain"


@pytest.mark.parametrize("case", workers.LONG_CTX_CASES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_long_ctx_matches_exact_attention(layout: str, case: str) -> None:
    errors = {}
    for result in cpu_launch(layout):
        got = part(result, "long_ctx")
        sp = LAYOUTS[layout][0] * LAYOUTS[layout][1]
        ref = workers.expected_rows(
            _reference_case(case), sp, LAYOUTS[layout][1], got["sp_rank"], got["ring_rank"]
        )
        errors[result["rank"]] = max_err(got[case]["out"], ref)
    worst = max(errors.values())
    print(f"{layout} {case}: max |layer - exact| = {worst:.2e} (per rank {errors})")
    assert worst <= FP32_TOL, f"{layout} {case}: max |err| {worst:.3e} > {FP32_TOL}"


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_ring_function_is_token_ring_and_ran(layout: str) -> None:
    ring = LAYOUTS[layout][1]
    for result in cpu_launch(layout):
        got = part(result, "long_ctx")
        for case in workers.LONG_CTX_CASES:
            run = got[case]
            assert run["ring_fn_is_token_ring"], (result["rank"], case, run["ring_fn"])
            # one kernel per ring step, N-1 Q messages; never xDiT's USP entry points
            counts = {k: run[k] for k in ("kernel_calls", "q_messages", "usp_ring_attn")}
            assert counts == dict(kernel_calls=ring, q_messages=ring - 1, usp_ring_attn=0), (
                result["rank"],
                case,
                counts,
            )
        assert got["token_ring/kv_cache_layer"]["use_kv_cache"] is True
        # the registered cache now holds this step's K/V, ring-local: (b, u * local, h/u, 2d)
        ulysses = LAYOUTS[layout][0]
        assert got["token_ring/kv_cache_registered"]["cached_shape"] == [
            workers.B,
            ulysses * workers.LOCAL,
            workers.H // ulysses,
            2 * workers.D,
        ]
        # Sana's linear attention keeps xDiT's own ring even with TokenRing selected
        assert got["sana_ring_fn_is_xdit"], got["sana_ring_fn"]
        # not selected and ring_impl_type="basic": xDiT's own ring function, the very object
        assert got["basic_ring_fn_is_xdit"], got["basic_ring_fn"]


KV_CACHE_SCRIPT = textwrap.dedent(
    """
    import json, os, tempfile
    from tokenring_xdit.patches import xfuser_cpu
    xfuser_cpu.enable()
    import torch.distributed as dist
    import xfuser  # noqa: F401  (patched on import: autopatch is on)
    from xfuser.core.long_ctx_attention import xFuserLongContextAttention
    from xfuser.core.long_ctx_attention.ring import xdit_ring_flash_attn_func
    import yunchang
    import tokenring_xdit.patches.xfuser as xfuser_patches
    from tokenring_xdit.hosts import xdit as xdit_ring

    init = os.path.join(tempfile.mkdtemp(), "rendezvous")
    dist.init_process_group("gloo", init_method="file://" + init, rank=0, world_size=1)
    yunchang.set_seq_parallel_pg(1, 1, 0, 1)
    report = {}
    layer = xFuserLongContextAttention(ring_impl_type="token_ring", use_kv_cache=True)
    report["patched"] = layer.ring_attn_fn is xdit_ring.long_ctx_ring_attn
    xfuser_patches.revert()  # xDiT as released; yunchang keeps its token_ring entry
    try:
        xFuserLongContextAttention(ring_impl_type="token_ring", use_kv_cache=True)
        report["unpatched_error"] = None
    except RuntimeError as exc:
        report["unpatched_error"] = str(exc)
    plain = xFuserLongContextAttention(ring_impl_type="token_ring")
    report["unpatched_ring_fn_is_xdit"] = plain.ring_attn_fn is xdit_ring_flash_attn_func
    dist.destroy_process_group()
    print(json.dumps(report))
    """
)


def test_kv_cache_with_token_ring_was_refused_by_xdit_and_is_accepted_now() -> None:
    """The patch is what makes use_kv_cache=True + token_ring constructible: with the xfuser
    patches reverted, xDiT's own check raises its RuntimeError again, and xDiT ignores
    ring_impl_type for the ring function (always its own)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENRING_XDIT_AUTOPATCH="1")
    proc = subprocess.run(
        [sys.executable, "-c", KV_CACHE_SCRIPT],
        capture_output=True,
        text=True,
        timeout=scaled(180),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["patched"] is True
    assert report["unpatched_error"] and "do not support SP kv cache" in report["unpatched_error"]
    assert report["unpatched_ring_fn_is_xdit"] is True
