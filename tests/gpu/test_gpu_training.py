"""GPU checks of the training path (marker `gpu`, run on the GPU machine):

python -m pytest -m gpu tests/gpu/test_gpu_training.py -q

- each CUDA per-block backward pair, fed split key blocks (even and uneven causal halves) with
  the GLOBAL lse and out (or only delta: the O stand-in), sums to autograd's gradients of exact
  attention (bf16 and fp16);
- cuDNN's backward stays right when the same q/k/v shapes see O in other strides and then the
  stand-in (torch caches its plan by q/k/v strides only; the pair lays O and dO out in q's order);
- the Triton delta / stand-in passes equal the torch ops;
- the training loops of a whole ring of 1-4 ranks as threads on this GPU (tests/thread_ring.py),
  causal zigzag (uneven halves) and not (uneven shards), cuDNN and torch flash pairs;
- ring degree 1 forward + backward through token_ring_attn_func (causal and not);
- the tiny Llama example at one rank against one process.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest
import torch

from tokenring_xdit.ring.kernels import has_flash_attn
from tokenring_xdit.ring.kernels.fa4 import has_fa4

pytestmark = pytest.mark.gpu

TOL = {torch.bfloat16: 4e-2, torch.float16: 8e-3}
# Every CUDA pair the ring's backward uses (fed delta, not O, away from the query's owner).
# torch_efficient's backward was wrong even with O (H100, torch 2.11) and is not used.
DELTA_PAIRS = ["cudnn", "torch_flash", "math"] + (["flash_attn"] if has_flash_attn() else [])
DELTA_PAIRS += ["fa4"] if has_fa4() else []
CASES = [(name, True) for name in DELTA_PAIRS] + [(n, False) for n in DELTA_PAIRS]


def _exact_grads(q, k, v, do, causal):
    ref_in = [x.double().requires_grad_() for x in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(*ref_in, is_causal=causal)
    out.backward(do.double())
    return out.detach(), [x.grad for x in ref_in]


def _split_grads(pair, q, k, v, do, o, lse, delta, split, with_out):
    """dq/dk/dv (fp64) summed over the three blocks of a causal split at `split`."""
    from tokenring_xdit.ring.tensor_layout import BHSD

    b, h, s, d = q.shape
    dq = torch.zeros(b, h, s, d, device="cuda", dtype=torch.float64)
    dk, dv = torch.zeros_like(dq), torch.zeros_like(dq)
    front, back = slice(0, split), slice(split, s)
    for qs, ks, causal in ((front, front, True), (back, front, False), (back, back, True)):
        g = pair.run_backward(
            do[:, :, qs], q[:, :, qs], k[:, :, ks], v[:, :, ks],
            o[:, :, qs] if with_out else None, lse[:, :, qs].contiguous(),
            delta[:, :, qs].contiguous(), d**-0.5, BHSD, causal,
        )  # fmt: skip
        dq[:, :, qs] += g[0].double()
        dk[:, :, ks] += g[1].double()
        dv[:, :, ks] += g[2].double()
    return dq, dk, dv


def _causal_case(dtype, d, seed, b=2, h=4, s=512):
    from tokenring_xdit.ring.kernels import row_delta
    from tokenring_xdit.ring.tensor_layout import BHSD

    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (
        torch.randn(b, h, s, d, device="cuda", generator=gen).to(dtype) for _ in range(4)
    )
    out, grads = _exact_grads(q, k, v, do, causal=True)
    scores = (q.double() @ k.double().transpose(-1, -2)) * d**-0.5
    mask = torch.ones(s, s, dtype=torch.bool, device="cuda").triu(1)
    lse = torch.logsumexp(scores.masked_fill(mask, float("-inf")), -1).float()
    o = out.to(dtype)
    return q, k, v, do, o, lse, row_delta(do, o, BHSD), grads


def _rel_errs(got, refs):
    return [
        ((g - r).abs().max() / r.abs().max().clamp_min(1)).item()
        for g, r in zip(got, refs, strict=True)
    ]


@pytest.mark.parametrize(
    "name,with_out", CASES, ids=[f"{n}-{'out' if o else 'delta'}" for n, o in CASES]
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("split", [256, 200], ids=["even", "uneven"])
def test_cuda_backward_pairs_sum_to_exact_gradients(name, with_out, dtype, d, split):
    from tokenring_xdit.ring.kernels import PAIRS

    q, k, v, do, o, lse, delta, refs = _causal_case(dtype, d, seed=d + split)
    got = _split_grads(PAIRS[name], q, k, v, do, o, lse, delta, split, with_out)
    for what, err in zip(("dq", "dk", "dv"), _rel_errs(got, refs), strict=True):
        assert err <= TOL[dtype], f"{name} {dtype} d={d} split={split} {what}: rel err {err:.3g}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_cudnn_standin_after_other_o_strides_on_the_same_shapes(dtype):
    """The ring calls cuDNN's backward on the same q/k/v shapes with the real O (its own
    queries) and with the stand-in (travelling ones); a caller may pass O in any strides."""
    from tokenring_xdit.ring.kernels import PAIRS

    q, k, v, do, o, lse, delta, refs = _causal_case(dtype, 128, seed=11, s=384)
    wide = torch.zeros(*o.shape[:2], 2 * o.shape[2], o.shape[3], dtype=dtype, device="cuda")
    o_strided = wide[:, :, : o.shape[2]].copy_(o)  # same values, other strides
    pair = PAIRS["cudnn"]
    for out in (o_strided, None, o.transpose(1, 2).contiguous().transpose(1, 2), None, o):
        with_out = out is not None
        got = _split_grads(pair, q, k, v, do, out if with_out else o, lse, delta, 192, with_out)
        assert max(_rel_errs(got, refs)) <= TOL[dtype], (with_out, _rel_errs(got, refs))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_triton_delta_and_standin_equal_the_torch_ops(dtype):
    from tokenring_xdit.ring.kernels import standin

    assert standin._triton_ok()
    gen = torch.Generator(device="cuda").manual_seed(5)
    do = torch.randn(2, 300, 3, 72, device="cuda", generator=gen).to(dtype).transpose(1, 2)
    o = torch.randn(2, 3, 300, 72, device="cuda", generator=gen).to(dtype)
    do[0, 1, 7] = 0
    delta = standin.row_delta_bhsd(do, o)
    ref = (do.double() * o.double()).sum(-1)
    assert (delta.double() - ref).abs().max().item() <= 1e-4 * ref.abs().max().item()
    x = standin.out_standin_bhsd(do, delta)
    assert x.stride() == do.stride() and x.dtype == dtype
    rowsum = (do.double() * x.double()).sum(-1)
    unit = {torch.bfloat16: 2**-8, torch.float16: 2**-11, torch.float32: 2**-23}[dtype]
    bound = (2 * unit + 1e-5) * delta.double().abs() + 1e-6  # X's rounding; fp32 row sums
    assert ((rowsum - delta.double()).abs() <= bound).all()
    assert x[0, 1, 7].abs().max().item() == 0


def test_auto_pair_is_cudnn_on_hopper():
    from tokenring_xdit.ring.kernels import select_pair

    cuda = torch.device("cuda")
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("cuDNN is the auto pair on Hopper and newer")
    for dtype in (torch.bfloat16, torch.float16):
        assert select_pair("auto", cuda, dtype, 128, 128, False).name == "cudnn"
    assert select_pair("auto", cuda, torch.float32, 128, 128, False).name == "math"


RING_CASES = [
    (1, True, [96]),
    (2, True, [64, 96]),
    (3, True, [96, 40, 64]),
    (4, True, [64, 96, 32, 80]),
    (2, False, [192, 128]),
    (3, False, [200, 96, 160]),
    (4, False, [128, 64, 192, 96]),
]


@pytest.mark.parametrize("n,causal,lens", RING_CASES, ids=[f"n{c[0]}-{c[1]}" for c in RING_CASES])
@pytest.mark.parametrize("name", ["cudnn", "torch_flash"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_thread_ring_on_one_gpu_matches_exact(n, causal, lens, name, layout):
    from tests.thread_ring import ring_case
    from tokenring_xdit.ring.kernels import PAIRS
    from tokenring_xdit.ring.tensor_layout import get_layout

    errs = ring_case(
        n, causal, lens, 2, 4, 128, torch.bfloat16, "cuda", PAIRS[name], get_layout(layout)
    )
    assert errs["out"] <= 2e-2 and max(errs[g] for g in ("dq", "dk", "dv")) <= 4e-2, errs


@pytest.mark.parametrize(
    "n,causal,lens", RING_CASES[1:], ids=[f"n{c[0]}-{c[1]}" for c in RING_CASES[1:]]
)
@pytest.mark.parametrize("name", ["cudnn", "torch_flash"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_thread_ring_held_back_on_one_gpu_matches_the_unsplit_loop(n, causal, lens, name, layout):
    """train_hold_back (ring/training/hold_back.py): the own block on head slices (strided views the
    kernels get, cuDNN's O/dO stride contract included) as exact as the unsplit loop."""
    from tests.thread_ring import ring_case
    from tokenring_xdit.ring.kernels import PAIRS
    from tokenring_xdit.ring.tensor_layout import get_layout

    args = (n, causal, lens, 2, 4, 128, torch.bfloat16, "cuda", PAIRS[name], get_layout(layout))
    base, held = ring_case(*args), ring_case(*args, hold_back=True)
    assert held["out"] <= 2e-2 and max(held[g] for g in ("dq", "dk", "dv")) <= 4e-2, held
    for what, err in held.items():
        assert err <= 1.1 * base[what] + 1e-3, (what, held, base)


@pytest.mark.parametrize("kernel", ["auto", "cudnn", "torch_flash", "torch_efficient"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_ring_degree_1_forward_backward(kernel, causal, layout):
    from tokenring_xdit.ring import token_ring_attn_func

    gen = torch.Generator(device="cuda").manual_seed(1)
    b, h, s, d = 2, 8, 1024, 128
    q, k, v, do = (
        torch.randn(b, h, s, d, device="cuda", generator=gen).bfloat16() for _ in range(4)
    )
    out_ref, grads = _exact_grads(q, k, v, do, causal)
    flip = (lambda x: x.transpose(1, 2)) if layout == "bshd" else (lambda x: x)
    loc = [flip(x).contiguous().requires_grad_() for x in (q, k, v)]
    out = token_ring_attn_func(*loc, causal=causal, layout=layout, kernel=kernel)
    out.backward(flip(do))
    assert (flip(out).double() - out_ref).abs().max().item() <= 2e-2
    for x, ref in zip(loc, grads, strict=True):
        err = ((flip(x.grad).double() - ref).abs().max() / ref.abs().max().clamp_min(1)).item()
        assert err <= TOL[torch.bfloat16], (kernel, causal, layout, err)


def test_tiny_llama_example_one_rank():
    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "llm_train_tokenring.py"
    spec = importlib.util.spec_from_file_location("llm_train_tokenring", path)
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example
    spec.loader.exec_module(example)
    import torch.distributed as dist

    import tokenring_xdit

    tokenring_xdit.install()
    if not dist.is_initialized():
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1)
    try:
        kwargs = dict(steps=3, seq=256, b=2, device="cuda")
        ring = example.train("token_ring", **kwargs)
        local = example.train("local", **kwargs)
        diff = example.compare(ring, local)
        print("tiny llama, 1 rank:", ring["losses"], local["losses"], diff)
        assert diff["max_loss_err"] <= 1e-4, diff
    finally:
        dist.destroy_process_group()
