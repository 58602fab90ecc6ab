"""GPU checks of GQA inside the ring (marker `gpu`, run on the GPU machine):

python -m pytest -m gpu tests/gpu/test_gpu_gqa.py -q -s

- each CUDA block kernel, wrapped for 8 query / 2 K/V heads (`ring/kernels/wrappers.py`: native
  or K/V expanded per block), against fp64 attention;
- each CUDA training pair, wrapped the same way and fed split key blocks with the GLOBAL lse and
  delta (or the real O for cuDNN), sums to autograd's gradients of exact attention, dK/dV in
  the K/V head count;
- ring degree 1 forward + backward through token_ring_attn_func with GQA.
Each case prints whether the kernel took GQA itself ("native") or was expanded.
"""

from __future__ import annotations

import pytest
import torch

from tokenring_xdit.ring.kernels import has_flash_attn
from tokenring_xdit.ring.kernels.fa4 import has_fa4

pytestmark = pytest.mark.gpu

TOL = {torch.bfloat16: 4e-2, torch.float16: 8e-3}
H, HK = 8, 2
# the optional packages' kernels, where installed (flash-attn 4 alone is not flash-attn)
FLASH = (["flash_attn"] if has_flash_attn() else []) + (["fa4"] if has_fa4() else [])


def _exact(q, k, v, do, causal):
    ref_in = [x.double().requires_grad_() for x in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(
        *ref_in, is_causal=causal, enable_gqa=True
    )
    out.backward(do.double())
    return out.detach(), [x.grad for x in ref_in]


def _rel(got, ref) -> float:
    return ((got.double() - ref).abs().max() / ref.abs().max().clamp_min(1)).item()


def _inputs(dtype, d, s=512):
    gen = torch.Generator(device="cuda").manual_seed(d)
    q, do = (torch.randn(2, H, s, d, device="cuda", generator=gen).to(dtype) for _ in "qo")
    k, v = (torch.randn(2, HK, s, d, device="cuda", generator=gen).to(dtype) for _ in "kv")
    return q, k, v, do


@pytest.mark.parametrize("name", ["cudnn", "torch_flash", "torch_efficient", "math", *FLASH])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_gqa_block_kernels_match_exact_attention(name, dtype):
    from tokenring_xdit.ring.kernels import KERNELS, gqa_kernel
    from tokenring_xdit.ring.tensor_layout import BHSD

    d = 128
    q, k, v, do = _inputs(dtype, d)
    ref, _ = _exact(q, k, v, do, causal=False)
    fn, _ = gqa_kernel(KERNELS[name], name, q.device, dtype, d, d)
    out, lse = fn(q, k, v, d**-0.5, BHSD)
    scores = (q.double() @ k.double().repeat_interleave(H // HK, 1).transpose(-1, -2)) * d**-0.5
    err_out, err_lse = _rel(out, ref), (lse.double() - torch.logsumexp(scores, -1)).abs().max()
    print(f"GQA kernel {name} {dtype} native={fn is KERNELS[name]} out {err_out:.2e} "
          f"lse {err_lse.item():.2e}")  # fmt: skip
    assert out.shape == q.shape and err_out <= TOL[dtype] and err_lse <= TOL[dtype]


PAIR_CASES = [("torch_flash", False), ("math", False), ("cudnn", True)] + [
    (n, False) for n in FLASH
]


@pytest.mark.parametrize(
    "name,with_out", PAIR_CASES, ids=[f"{n}-{'out' if o else 'delta'}" for n, o in PAIR_CASES]
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("d", [64, 128])
def test_gqa_backward_pairs_sum_to_exact_gradients(name, with_out, dtype, d):
    from tokenring_xdit.ring.kernels import PAIRS, gqa_pair, row_delta
    from tokenring_xdit.ring.tensor_layout import BHSD

    pair = gqa_pair(PAIRS[name], torch.device("cuda"), dtype, d, d)
    q, k, v, do = _inputs(dtype, d)
    s, half = q.shape[2], q.shape[2] // 2
    out, (gq, gk, gv) = _exact(q, k, v, do, causal=True)
    scores = (q.double() @ k.double().repeat_interleave(H // HK, 1).transpose(-1, -2)) * d**-0.5
    mask = torch.ones(s, s, dtype=torch.bool, device="cuda").triu(1)
    lse = torch.logsumexp(scores.masked_fill(mask, float("-inf")), -1).float()
    o = out.to(dtype)
    delta = row_delta(do, o, BHSD)
    dq = torch.zeros(q.shape, device="cuda", dtype=torch.float64)
    dk, dv = (torch.zeros(k.shape, device="cuda", dtype=torch.float64) for _ in "kv")
    front, back = slice(0, half), slice(half, s)
    # the three blocks of a causal zigzag split (diagonal, below, diagonal)
    for qs, ks, causal in ((front, front, True), (back, front, False), (back, back, True)):
        g = pair.run_backward(
            do[:, :, qs], q[:, :, qs], k[:, :, ks], v[:, :, ks],
            o[:, :, qs] if with_out else None, lse[:, :, qs].contiguous(),
            delta[:, :, qs].contiguous(), d**-0.5, BHSD, causal,
        )  # fmt: skip
        assert g[1].shape == k[:, :, ks].shape and g[2].shape == v[:, :, ks].shape
        dq[:, :, qs] += g[0].double()
        dk[:, :, ks] += g[1].double()
        dv[:, :, ks] += g[2].double()
    errs = {w: _rel(got, ref) for w, got, ref in (("dq", dq, gq), ("dk", dk, gk), ("dv", dv, gv))}
    print(f"GQA pair {name} {dtype} d={d} native={pair is PAIRS[name]} "
          + " ".join(f"{w} {e:.2e}" for w, e in errs.items()))  # fmt: skip
    for what, err in errs.items():
        assert err <= TOL[dtype], f"{name} {dtype} d={d} {what}: rel err {err:.3g}"


@pytest.mark.parametrize("kernel", ["auto", "torch_flash", "math"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_ring_degree_1_gqa_forward_backward(kernel, causal, kv_heads):
    from tokenring_xdit import token_ring_attn_func

    gen = torch.Generator(device="cuda").manual_seed(3)
    b, s, d = 2, 1024, 128
    q, do = (torch.randn(b, s, H, d, device="cuda", generator=gen).bfloat16() for _ in "qo")
    k, v = (torch.randn(b, s, kv_heads, d, device="cuda", generator=gen).bfloat16() for _ in "kv")
    ref, grads = _exact(*(x.transpose(1, 2) for x in (q, k, v, do)), causal)
    got_in = [x.clone().requires_grad_() for x in (q, k, v)]
    out = token_ring_attn_func(*got_in, causal=causal, kernel=kernel)
    out.backward(do)
    errs = {"out": _rel(out.transpose(1, 2), ref)}
    for what, x, g in zip(("dq", "dk", "dv"), got_in, grads, strict=True):
        assert x.grad.shape == x.shape
        errs[what] = _rel(x.grad.transpose(1, 2), g)
    print(f"GQA ring-1 {kernel} causal={causal} kv_heads={kv_heads} "
          + " ".join(f"{w} {e:.2e}" for w, e in errs.items()))  # fmt: skip
    for what, err in errs.items():
        assert err <= 4e-2, f"{kernel} causal={causal} {what}: {err:.3g}"
