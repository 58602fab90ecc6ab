"""Per-block kernel pairs for training: a causal-capable forward and its backward, one family.

forward(q, k, v, scale, layout, causal) -> (out in q's dtype, lse (b, h, s_q) fp32)
backward(dout, q, k, v, out, lse, delta, scale, layout, causal) -> (dq, dk, dv) in q's dtype

`lse` and `delta` = rowsum(dO * O) are those of the WHOLE attention row (the merged result), so
the per-block gradients of all key blocks sum to the exact gradients. `out` is the merged output
where this rank has it (its own queries; `delta` may then be None) and None for a travelling
query block, which brings only delta (one fp32 per row instead of a row of O). The SDPA-style
backward ops read `out` only through rowsum(dO * out), so for them a stand-in with that row sum
is built from dO and delta (`standin.py`).

cuDNN's backward additionally bakes the STRIDES of O and dO into a graph that torch caches under
a key of q/k/v's shapes and strides only: a later call with the same q/k/v but differently
strided O or dO reuses the plan and reads them wrongly (that, not the stand-in's values, made
the stand-in look wrong on H100). So cuDNN always gets O (or the stand-in) and dO laid out in
q's dimension order, as torch's own forward allocates O; that is a no-op in the ring's own calls.
`causal` is top-left aligned (only used on the square diagonal block).
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .kernels import empty_block, has_flash_attn, lse_bhs
from .layout import BHSD, Layout
from .standin import out_standin_bhsd, row_delta_bhsd

__all__ = ["KernelPair", "PAIRS", "select_pair", "row_delta"]


@dataclass(frozen=True)
class KernelPair:
    name: str
    forward: Callable
    backward: Callable
    deterministic: bool  # the backward gives bit-identical results run to run

    def run_forward(self, q, k, v, scale: float, layout: Layout, causal: bool):
        empty = empty_block(q, k, v, layout)
        return empty if empty is not None else self.forward(q, k, v, scale, layout, causal)

    def run_backward(self, dout, q, k, v, out, lse, delta, scale, layout, causal):
        """out: the merged output, or None (then delta is required); delta may be None with out."""
        if 0 in (q.shape[layout.seq_dim], k.shape[layout.seq_dim]):
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        return self.backward(dout, q, k, v, out, lse, delta, scale, layout, causal)


def row_delta(dout: torch.Tensor, out: torch.Tensor, layout: Layout) -> torch.Tensor:
    """delta = rowsum(dO * O), (b, h, s) fp32 (one pass, fp32 math)."""
    return row_delta_bhsd(layout.to_bhsd(dout), layout.to_bhsd(out))


def _bhsd_args(dout, q, k, v, out, delta, layout):
    dob, qb, kb, vb = (layout.to_bhsd(x) for x in (dout, q, k, v))
    ob = layout.to_bhsd(out) if out is not None else out_standin_bhsd(dob, delta)
    return dob, qb, kb, vb, ob


def _back(layout: Layout, grads) -> tuple[torch.Tensor, ...]:
    return tuple(layout.from_bhsd(g) for g in grads)


# --- math: exact, any device (fp32 math; fp64 stays fp64), also under a documents mask ----------


def segments_mask(mask, s_q: int, s_k: int, device) -> torch.Tensor:
    """(s_q, s_k) bool: True where a query may see a key. `mask`: a bool (top-left causal or
    all) or packed documents' segments (query run x key run, causal or full: doc_kernels.py)."""
    if isinstance(mask, bool):
        full = torch.ones(s_q, s_k, dtype=torch.bool, device=device)
        return full.tril() if mask else full
    m = torch.zeros(s_q, s_k, dtype=torch.bool, device=device)
    for s in mask:
        block = m[s.q0 : s.q1, s.k0 : s.k1]
        block.fill_(True)
        if s.causal:
            block.tril_()
    return m


def _math_scores(q, k, scale, layout, mask):
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    qb, kb = (layout.to_bhsd(x).to(acc) for x in (q, k))
    scores = (qb @ kb.transpose(-1, -2)) * scale
    if mask is not False:
        allowed = segments_mask(mask, scores.shape[-2], scores.shape[-1], q.device)
        scores = scores.masked_fill(~allowed, float("-inf"))
    return qb, kb, scores


def _finite(lse: torch.Tensor) -> torch.Tensor:
    """lse with -inf rows (no visible key: a packed block's rows outside every document) as 0,
    so exp(scores - lse) is 0 there, not NaN."""
    return torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)


def _math_forward(q, k, v, scale, layout, mask):
    _, _, scores = _math_scores(q, k, scale, layout, mask)
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.exp(scores - _finite(lse).unsqueeze(-1)) @ layout.to_bhsd(v).to(scores.dtype)
    return layout.from_bhsd(out.to(q.dtype)), lse.float()


def _math_backward(dout, q, k, v, out, lse, delta, scale, layout, mask):
    if delta is None:
        delta = row_delta(dout, out, layout)
    qb, kb, scores = _math_scores(q, k, scale, layout, mask)
    acc = scores.dtype
    p = torch.exp(scores - _finite(lse.to(acc)).unsqueeze(-1))
    dob, vb = layout.to_bhsd(dout).to(acc), layout.to_bhsd(v).to(acc)
    dv = p.transpose(-1, -2) @ dob
    ds = p * (dob @ vb.transpose(-1, -2) - delta.to(acc).unsqueeze(-1))
    dq, dk = (ds @ kb) * scale, (ds.transpose(-1, -2) @ qb) * scale
    return _back(layout, (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)))


# --- torch's CPU flash kernel --------------------------------------------------------------


def _cpu_forward(q, k, v, scale, layout, causal):
    qb, kb, vb = (layout.to_bhsd(x) for x in (q, k, v))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        qb, kb, vb, 0.0, causal, scale=scale
    )[:2]
    return layout.from_bhsd(out), lse_bhs(lse, *qb.shape[:3])


def _cpu_backward(dout, q, k, v, out, lse, delta, scale, layout, causal):
    dob, qb, kb, vb, ob = _bhsd_args(dout, q, k, v, out, delta, layout)
    grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        dob, qb, kb, vb, ob, lse, 0.0, causal, scale=scale
    )
    return _back(layout, grads)


# --- CUDA: torch's SDPA flash / efficient / cuDNN ops, flash-attn ----------------------------


def _no_rng(device) -> torch.Tensor:
    # dropout is 0, so the ops never read the philox state
    return torch.zeros((), dtype=torch.int64, device=device)


def _flash_forward(q, k, v, scale, layout, causal):
    qb, kb, vb = (layout.to_bhsd(x) for x in (q, k, v))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention(
        qb, kb, vb, 0.0, causal, False, scale=scale
    )[:2]
    return layout.from_bhsd(out), lse_bhs(lse, *qb.shape[:3])


def _flash_backward(dout, q, k, v, out, lse, delta, scale, layout, causal):
    dob, qb, kb, vb, ob = _bhsd_args(dout, q, k, v, out, delta, layout)
    rng = _no_rng(q.device)
    grads = torch.ops.aten._scaled_dot_product_flash_attention_backward(
        dob, qb, kb, vb, ob, lse.contiguous(), None, None, qb.shape[2], kb.shape[2], 0.0, causal,
        rng, rng, scale=scale,
    )  # fmt: skip
    return _back(layout, grads)


def _efficient_forward(q, k, v, scale, layout, causal):
    qb, kb, vb = (layout.to_bhsd(x) for x in (q, k, v))
    out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
        qb, kb, vb, None, True, 0.0, causal, scale=scale
    )[:2]
    return layout.from_bhsd(out), lse_bhs(lse, *qb.shape[:3])


def _efficient_backward(dout, q, k, v, out, lse, delta, scale, layout, causal):
    dob, qb, kb, vb, ob = _bhsd_args(dout, q, k, v, out, delta, layout)
    # the kernel reads lse padded to a multiple of 32 queries, as its forward returns it
    pad = (-lse.shape[-1]) % 32
    lse_p = torch.nn.functional.pad(lse, (0, pad)).contiguous()
    rng = _no_rng(q.device)
    grads = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
        dob, qb, kb, vb, None, ob, lse_p, rng, rng, 0.0, [True, True, True, False], causal,
        scale=scale,
    )[:3]  # fmt: skip
    return _back(layout, grads)


def _cudnn_forward(q, k, v, scale, layout, causal):
    qb, kb, vb = (layout.to_bhsd(x) for x in (q, k, v))
    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
        qb, kb, vb, None, True, 0.0, causal, False, scale=scale
    )[:2]
    return layout.from_bhsd(out), lse_bhs(lse, *qb.shape[:3])


def _matching_strides(q: torch.Tensor, shape) -> tuple[int, ...]:
    """Dense strides for `shape` in q's dimension order (how torch's cuDNN forward lays out O)."""
    order = sorted(range(q.dim()), key=lambda i: q.stride(i))  # innermost first, stable
    strides, step = [0] * q.dim(), 1
    for i in order:
        strides[i] = step
        step *= shape[i]
    return tuple(strides)


def _with_strides(x: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """x itself when it already has `strides` (sizes of 1 ignored), else a copy that has them."""
    if all(n == 1 or a == b for n, a, b in zip(x.shape, x.stride(), strides, strict=True)):
        return x
    return torch.empty_strided(x.shape, strides, dtype=x.dtype, device=x.device).copy_(x)


def _cudnn_backward(dout, q, k, v, out, lse, delta, scale, layout, causal):
    qb, kb, vb, dob = (layout.to_bhsd(x) for x in (q, k, v, dout))
    # O and dO in q's order: torch caches cuDNN's plan by q/k/v strides only (module docstring)
    strides = _matching_strides(qb, dob.shape)
    dob = _with_strides(dob, strides)
    if out is not None:
        ob = _with_strides(layout.to_bhsd(out), strides)
    else:
        ob = out_standin_bhsd(dob, delta, strides)
    rng = _no_rng(q.device)
    # cuDNN's stats tensor is (b, h, s, 1), as its forward returns it
    grads = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        dob, qb, kb, vb, ob, lse.unsqueeze(-1).contiguous(), rng, rng, None, None, None,
        qb.shape[2], kb.shape[2], 0.0, causal, scale=scale,
    )  # fmt: skip
    return _back(layout, grads)


def _fa_flip(layout, *xs):
    # flash-attn wants (b, s, h, d); transpose(1, 2) maps between the two layouts both ways
    return tuple(x.transpose(1, 2) if layout is BHSD and x is not None else x for x in xs)


def _fa_forward(q, k, v, scale, layout, causal):
    from flash_attn import flash_attn_func  # optional extra

    qs, ks, vs = _fa_flip(layout, q, k, v)
    out, lse, _ = flash_attn_func(
        qs, ks, vs, softmax_scale=scale, causal=causal, return_attn_probs=True
    )
    return _fa_flip(layout, out)[0], lse.float()


@functools.cache
def _fa_backward_params() -> frozenset[str]:
    from flash_attn.flash_attn_interface import _flash_attn_backward

    return frozenset(inspect.signature(_flash_attn_backward).parameters)


def _fa_backward_impl(dout, q, k, v, out, lse, delta, scale, layout, causal, deterministic):
    from flash_attn.flash_attn_interface import _flash_attn_backward

    if out is None:
        out = layout.from_bhsd(out_standin_bhsd(layout.to_bhsd(dout), delta))
    dos, qs, ks, vs, os_ = (x.contiguous() for x in _fa_flip(layout, dout, q, k, v, out))
    dq, dk, dv = (torch.empty_like(x) for x in (qs, ks, vs))
    kwargs = dict(dropout_p=0.0, softmax_scale=scale, causal=causal, softcap=0.0)
    kwargs.update(alibi_slopes=None, deterministic=deterministic)
    params = _fa_backward_params()
    if "window_size" in params:  # flash-attn 2.6
        kwargs["window_size"] = (-1, -1)
    else:
        kwargs.update(window_size_left=-1, window_size_right=-1)
    kwargs = {key: val for key, val in kwargs.items() if key in params}
    _flash_attn_backward(dos, qs, ks, vs, os_, lse.contiguous(), dq, dk, dv, **kwargs)
    return _fa_flip(layout, dq, dk, dv)


def _fa_backward(*args):
    return _fa_backward_impl(*args, deterministic=False)


def _fa_backward_deterministic(*args):
    return _fa_backward_impl(*args, deterministic=True)


PAIRS: dict[str, KernelPair] = {
    "math": KernelPair("math", _math_forward, _math_backward, True),
    "cpu_flash": KernelPair("cpu_flash", _cpu_forward, _cpu_backward, True),
    "torch_flash": KernelPair("torch_flash", _flash_forward, _flash_backward, False),
    "torch_efficient": KernelPair(
        "torch_efficient", _efficient_forward, _efficient_backward, False
    ),
    "cudnn": KernelPair("cudnn", _cudnn_forward, _cudnn_backward, False),
    "flash_attn": KernelPair("flash_attn", _fa_forward, _fa_backward, False),
}
_DETERMINISTIC_FA = KernelPair("flash_attn", _fa_forward, _fa_backward_deterministic, True)


# The efficient op's backward gave wrong gradients even with the real O (H100, torch 2.11): its
# forward's equivalent with a usable backward runs instead.
_NO_RING_BACKWARD = ("torch_efficient",)
_HALF = (torch.float16, torch.bfloat16)


def _auto_order(device: torch.device, dtype: torch.dtype) -> tuple[str, ...]:
    """Training pairs to try, fastest first, for 'auto'."""
    if device.type != "cuda":
        return ("cpu_flash", "math")
    if dtype not in _HALF:
        return ("math",)  # the fast CUDA kernels take half precision only
    # cuDNN runs ~1.7x torch flash on Hopper (550 vs 310 TFLOP/s fwd+bwd, H100) and is ahead
    # of flash-attn 2 there; before Hopper flash-attn is the fast, well-trodden one.
    if torch.cuda.get_device_capability(device)[0] >= 9:
        return ("cudnn", "flash_attn", "torch_flash", "math")
    return ("flash_attn", "torch_flash", "cudnn", "math")


@functools.cache
def _pair_works(name: str, device: str, dtype: torch.dtype, d_qk: int, d_v: int) -> bool:
    """One tiny causal forward + stand-in backward, compared with the exact pair: a kernel that
    lacks this head size (or its backward) is skipped instead of failing in the first step."""
    if name == "flash_attn" and not has_flash_attn():
        return False
    if name == "math":
        return True
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k = (torch.randn(1, 2, 24, d_qk, generator=gen) for _ in range(2))
    v, dout = (torch.randn(1, 2, 24, d_v, generator=gen) for _ in range(2))
    q, k, v, dout = (x.to(device, dtype) for x in (q, k, v, dout))
    got, ref = [], []
    try:
        for pair, res in ((PAIRS[name], got), (PAIRS["math"], ref)):
            out, lse = pair.run_forward(q, k, v, d_qk**-0.5, BHSD, True)
            delta = row_delta(dout, out, BHSD)
            grads = pair.run_backward(dout, q, k, v, None, lse, delta, d_qk**-0.5, BHSD, True)
            res.extend(x.float() for x in (out, lse, *grads))
        for a, b in zip(got, ref, strict=True):
            if a.shape != b.shape or not (a - b).abs().max() <= 3e-2 * max(1.0, b.abs().max()):
                return False
    except (RuntimeError, NotImplementedError, ImportError, TypeError):
        return False
    return True


def select_pair(
    kernel: str, device: torch.device, dtype: torch.dtype, d_qk: int, d_v: int, deterministic: bool
) -> KernelPair:
    """The training pair for a kernel name ("auto": the fastest pair that works here)."""
    if not isinstance(kernel, str):
        raise NotImplementedError(
            "TokenRing training and causal attention need a kernel with a matching backward; a "
            f"custom block kernel has none. Pass kernel='auto' or one of {sorted(PAIRS)} (from "
            "yunchang: attn_type FA, TORCH_FLASH, TORCH_EFFICIENT, TORCH_CUDNN or TORCH_MATH, "
            "no attn_processor)"
        )
    name = kernel
    if kernel == "auto":
        order = _auto_order(device, dtype)
        name = next(n for n in order if _pair_works(n, device.type, dtype, d_qk, d_v))
    if name in _NO_RING_BACKWARD:
        name = "torch_flash" if dtype in _HALF else "math"
    if name not in PAIRS:
        raise ValueError(f"unknown kernel {name!r}; use 'auto' or one of {sorted(PAIRS)}")
    if name == "flash_attn" and importlib.util.find_spec("flash_attn") is None:
        raise ValueError(
            "kernel 'flash_attn' needs the flash-attn package (pip install flash-attn)"
        )
    pair = PAIRS[name]
    if deterministic and name == "flash_attn":
        return _DETERMINISTIC_FA
    if deterministic and not pair.deterministic:
        raise NotImplementedError(
            f"deterministic=True: the {name!r} backward is not deterministic; use flash-attn "
            "(yunchang attn_type FA) or the exact 'math' kernel (TORCH_MATH), or "
            "deterministic=False"
        )
    return pair
