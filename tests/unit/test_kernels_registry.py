"""Per-block kernels on CPU: cpu_flash against the exact math kernel, lse semantics, selection."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.speed import scaled
from tokenring_xdit.ring.kernels import KERNELS, cpu_flash, select_kernel
from tokenring_xdit.ring.kernels import math as math_kernel
from tokenring_xdit.ring.tensor_layout import BHSD, BSHD, Layout

LAYOUTS = [BSHD, BHSD]
# (out atol, out rtol, lse atol). bf16 out is rounded to bf16 by both kernels, so two correct
# kernels may differ by one bf16 ulp (2**-7 relative); lse is fp32 from the same bf16 inputs.
TOL = {torch.float32: (2e-5, 0.0, 2e-5), torch.bfloat16: (1e-2, 1.6e-2, 2e-3)}


def _assert_near(got, ref, atol, rtol, what):
    """|got - ref| <= atol + rtol * |ref| everywhere; the worst excess in the message."""
    got, ref = got.double(), ref.double()
    err = (got - ref).abs()
    excess = (err - atol - rtol * ref.abs()).max().item()
    assert excess <= 0, (
        f"{what}: max |err| {err.max().item():.3g} exceeds atol {atol} + rtol {rtol} * |ref| "
        f"by {excess:.3g}"
    )


def _make(layout: Layout, b, s_q, s_k, h, d, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, s_q, d, generator=gen)
    k = torch.randn(b, h, s_k, d, generator=gen)
    v = torch.randn(b, h, s_k, d, generator=gen)
    return tuple(layout.from_bhsd(x).to(dtype).contiguous() for x in (q, k, v))


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.name)
@pytest.mark.parametrize("d", [64, 72, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("s_q,s_k", [(37, 37), (19, 83), (70, 5)])
def test_cpu_flash_matches_math(layout, d, dtype, s_q, s_k, reference):
    b, h = 2, 3
    q, k, v = _make(layout, b, s_q, s_k, h, d, dtype, seed=d + s_q)
    scale = d**-0.5
    out_f, lse_f = cpu_flash(q, k, v, scale, layout)
    out_m, lse_m = math_kernel(q, k, v, scale, layout)
    for name, out, lse in (("cpu_flash", out_f, lse_f), ("math", out_m, lse_m)):
        assert out.dtype == dtype, (name, out.dtype)
        assert out.shape == q.shape, (name, out.shape, q.shape)
        assert lse.dtype == torch.float32, (name, lse.dtype)
        assert lse.shape == (b, h, s_q), (name, lse.shape)
    tol_out, rtol_out, tol_lse = TOL[dtype]
    what = f"{layout.name} d={d} {dtype} q={s_q} kv={s_k}"
    _assert_near(out_f, out_m, tol_out, rtol_out, f"{what}: cpu_flash vs math out")
    _assert_near(lse_f, lse_m, tol_lse, 0.0, f"{what}: cpu_flash vs math lse")
    # and both against fp64 attention of the same (rounded) inputs
    ref_out, ref_lse = reference.exact_attention(q, k, v, scale=scale, layout=layout.name)
    for name, out, lse in (("cpu_flash", out_f, lse_f), ("math", out_m, lse_m)):
        _assert_near(out, ref_out, tol_out, rtol_out / 2, f"{what}: {name} out vs fp64")
        _assert_near(lse, ref_lse, tol_lse, 0.0, f"{what}: {name} lse vs fp64")


@pytest.mark.parametrize("kernel", [cpu_flash, math_kernel], ids=["cpu_flash", "math"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.name)
@pytest.mark.parametrize("scale", [0.05, 0.125, 1.3])
def test_lse_is_fp32_logsumexp_of_scaled_scores(kernel, layout, scale):
    q, k, v = _make(layout, 1, 21, 33, 2, 64, torch.float32, seed=11)
    _, lse = kernel(q, k, v, scale, layout)
    qb, kb = (layout.to_bhsd(x).double() for x in (q, k))
    ref = torch.logsumexp((qb @ kb.transpose(-1, -2)) * scale, dim=-1)
    assert lse.dtype == torch.float32
    err = (lse.double() - ref).abs().max().item()
    assert err <= 1e-5, f"lse vs logsumexp(scale={scale} * q.k): {err:.3g}"
    # a placeholder lse (zeros, or the unscaled one) must not pass
    unscaled = torch.logsumexp(qb @ kb.transpose(-1, -2), dim=-1)
    assert (lse.double() - unscaled).abs().max().item() > 1e-2


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.name)
def test_kernels_accept_non_contiguous_inputs(layout):
    q, k, v = _make(layout, 2, 24, 40, 4, 64, torch.float32, seed=2)
    # the same values as strided views: through a transpose, and a slice of a wider tensor
    q_nc = layout.from_bhsd(layout.to_bhsd(q).contiguous())  # bshd: a transposed view
    wide = torch.cat([k, torch.randn_like(k)], dim=3)
    k_nc = wide[..., :64]
    assert not k_nc.is_contiguous()
    for kernel in (cpu_flash, math_kernel):
        out_a, lse_a = kernel(q, k, v, 0.125, layout)
        out_b, lse_b = kernel(q_nc, k_nc, v, 0.125, layout)
        torch.testing.assert_close(out_b, out_a, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(lse_b, lse_a, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 72, 128])
def test_auto_selects_cpu_flash_on_cpu(dtype, d):
    name, fn = select_kernel("auto", torch.device("cpu"), dtype, d, d)
    assert name == "cpu_flash", (dtype, d, name)
    assert fn is cpu_flash


@pytest.mark.parametrize("name", ["math", "cpu_flash"])
def test_named_kernel_is_returned(name):
    got, fn = select_kernel(name, torch.device("cpu"), torch.float32, 64, 64)
    assert got == name and fn is KERNELS[name]


def test_unknown_kernel_lists_the_names():
    with pytest.raises(ValueError) as info:
        select_kernel("flash3000", torch.device("cpu"), torch.float32, 64, 64)
    msg = str(info.value)
    assert "flash3000" in msg and "auto" in msg, msg
    for name in KERNELS:
        assert name in msg, f"{name} missing from: {msg}"


_EMPTY_SEQ_SCRIPT = """
import sys, torch
from tokenring_xdit.ring.kernels import cpu_flash, math
from tokenring_xdit.ring.tensor_layout import BHSD
s_q, s_k = int(sys.argv[1]), int(sys.argv[2])
gen = torch.Generator().manual_seed(0)
q = torch.randn(1, 2, s_q, 64, generator=gen)
k = torch.randn(1, 2, s_k, 64, generator=gen)
out, lse = cpu_flash(q, k, k, 0.125, BHSD)
ref_out, ref_lse = math(q, k, k, 0.125, BHSD)
assert out.shape == ref_out.shape and lse.shape == ref_lse.shape, (out.shape, lse.shape)
# no keys: out 0 and lse -inf, so that a ring merge ignores the block
assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse), (out, lse)
print("OK")
"""


@pytest.mark.parametrize("s_q,s_k", [(8, 0), (0, 8)], ids=["empty-kv", "empty-q"])
def test_cpu_flash_survives_empty_sequences(s_q, s_k):
    """BUG: torch's CPU flash kernel dies with SIGFPE on a zero-length q or k/v; the ring's
    input checks accept zero-length shards, so one empty rank kills its process. Run in a
    subprocess: the crash must not take pytest down with it."""
    proc = subprocess.run(
        [sys.executable, "-c", _EMPTY_SEQ_SCRIPT, str(s_q), str(s_k)],
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, (
        f"cpu_flash on q_len={s_q}, kv_len={s_k}: exit code {proc.returncode} "
        f"(-8 = SIGFPE)\n{proc.stdout}\n{proc.stderr[-2000:]}"
    )


# --- the registry: one record per kernel, one auto order, resolve_kernel ----------------------


def test_inference_runs_the_forward_of_the_training_record():
    from tokenring_xdit.ring.kernels import PAIRS, REGISTRY

    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 3, 11, 40, generator=gen) for _ in range(3))
    for name in ("cpu_flash", "math"):
        assert PAIRS[name] is REGISTRY[name]
        out, lse = KERNELS[name](q, k, v, 0.2, BHSD)
        ref_out, ref_lse = REGISTRY[name].forward(q, k, v, 0.2, BHSD, False)
        assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse), name
        # an inference kernel's digest family is its public name
        assert f"{KERNELS[name].__module__}.{KERNELS[name].__qualname__}" == (
            f"tokenring_xdit.ring.kernels.{name}"
        )


def test_auto_orders():
    from tokenring_xdit.ring.kernels import auto_order, has_flash_attn

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    for train in (False, True):
        assert auto_order(cpu, torch.bfloat16, train) == ("cpu_flash", "math")
    fa = ("flash_attn",) if has_flash_attn() else ()
    assert auto_order(cuda, torch.bfloat16, False) == (
        *fa,
        "cudnn",
        "torch_flash",
        "torch_efficient",
        "math",
    )
    # the fast CUDA kernels take half precision only
    assert auto_order(cuda, torch.float32, False) == ("torch_efficient", "math")


def test_torch_efficient_trains_as_torch_flash_and_says_so(caplog):
    from tokenring_xdit.ring.kernels import registry, select_pair

    registry._say_trained_as.cache_clear()  # said once per process: forget earlier tests
    cpu = torch.device("cpu")
    with caplog.at_level("WARNING", logger="tokenring_xdit"):
        assert select_pair("torch_efficient", cpu, torch.bfloat16, 64, 64, False).name == (
            "torch_flash"
        )
    assert "'torch_efficient' has no usable ring backward" in caplog.text
    assert "runs 'torch_flash'" in caplog.text


def _choice(kernel, train, deterministic=False, packed=False, kernel_key=None, layout=BHSD):
    from tokenring_xdit.ring.seam.kernel_choice import resolve_kernel

    q = k = v = torch.zeros(1, 2, 8, 16)
    return resolve_kernel(
        kernel, kernel_key, q, k, v, layout,
        train=train, deterministic=deterministic, packed=packed,
    )  # fmt: skip


def test_resolve_kernel_names_the_family_and_reports_problems():
    from tokenring_xdit.ring.agree import Problem
    from tokenring_xdit.ring.kernels import PAIRS

    got = _choice("auto", train=False)
    assert (got.fn, got.key, got.family, got.problem) == (cpu_flash, "auto", "cpu_flash", 0)
    got = _choice("auto", train=True, deterministic=True)
    assert got.fn is PAIRS["cpu_flash"] and got.family == ("pair", "cpu_flash", True)
    assert _choice("auto", train=True, packed=True).family == ("pair", "masked", False)
    got = _choice(math_kernel, train=False, kernel_key="k")
    assert (got.fn, got.key, got.family) == (math_kernel, "k", "k")
    assert _choice(math_kernel, train=False).family == "tokenring_xdit.ring.kernels.math"
    # every refusal becomes a problem code for the input check (raised on every rank there)
    for kernel, train, code, text in (
        ("nope", False, Problem.KERNEL_UNUSABLE, "unknown kernel 'nope'"),
        ("nope", True, Problem.KERNEL_UNUSABLE, "unknown kernel 'nope'"),
        (math_kernel, True, Problem.KERNEL_UNSUPPORTED, "custom block kernel has none"),
    ):
        got = _choice(kernel, train)
        assert (got.fn, got.family, got.problem) == (None, "unusable", code)
        assert text in got.problem_text, got.problem_text
    got = _choice("torch_flash", train=True, deterministic=True)
    assert got.problem == Problem.KERNEL_UNSUPPORTED and "not deterministic" in got.problem_text


def test_a_layout_the_record_does_not_take_is_refused():
    import dataclasses

    from tokenring_xdit.ring.kernels import MATH
    from tokenring_xdit.ring.kernels.registry import check_layout

    check_layout(MATH, BSHD)
    with pytest.raises(ValueError, match="takes layouts \\['bshd'\\], not 'bhsd'"):
        check_layout(dataclasses.replace(MATH, layouts=(BSHD,)), BHSD)
