"""Why cuDNN's backward looked wrong with the O stand-in: plan cache vs stand-in values.

    python benchmarks/diagnostics/diag_cudnn_backward.py --out diag_cudnn_backward.json

torch caches cuDNN's backward plan under q/k/v's shapes and strides only, while the plan also
bakes in the strides of O and dO. Each scenario below uses its own sequence length (so its own
cache entry) and calls torch's cuDNN backward op directly, in the order given, reporting the
relative max error of dq/dk/dv vs fp64 autograd (b 2, h 4, d 128):

- fresh_standin: the stand-in X (dense, q's order) is the first O this key sees; then the real O;
- permuted_o_*: the first call passes the real O and dO with (b, s, h, d) memory (same values,
  same footprint, other strides), the next ones pass the dense X, the dense real O, and X with
  the permuted strides (a first version used O/dO sliced from a longer tensor: the reused plan
  then read past the dense tensors, an illegal memory access on one H100);
- pair_standin_after_permuted: the `cudnn` pair (stand-in, out=None) on a key that a raw call
  with permuted O/dO planned first (torch's cache is process-wide: the pair cannot undo that);
- dense_o_then_standin: real O (dense) first, then X with the same strides;
- do_strides: dO dense first, then dO with (b, s, h, d) memory (O unchanged);
- pair_sliced_o_first / pair_standin_next: the pair alone on a fresh key, the real O passed as
  a strided slice first (the pair lays it out in q's order), the stand-in next.
"""

from __future__ import annotations

import argparse
import json
import platform

import torch


def _bwd(do, q, k, v, o, lse, causal):
    rng = torch.zeros((), dtype=torch.int64, device=q.device)
    return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        do, q, k, v, o, lse.unsqueeze(-1).contiguous(), rng, rng, None, None, None,
        q.shape[2], k.shape[2], 0.0, causal, scale=q.shape[-1] ** -0.5,
    )  # fmt: skip


def _case(s, dtype, causal, seed, d=128, b=2, h=4):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(b, h, s, d, device="cuda", generator=gen).to(dtype) for _ in "1234")
    ref = [x.double().requires_grad_() for x in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(*ref, is_causal=causal)
    out.backward(do.double())
    scores = (q.double() @ k.double().transpose(-1, -2)) * d**-0.5
    if causal:
        scores = scores.masked_fill(
            torch.ones(s, s, dtype=torch.bool, device="cuda").triu(1), -1e30
        )
    lse = torch.logsumexp(scores, -1).float()
    return q, k, v, do, out.detach().to(dtype), lse, [x.grad for x in ref]


def _err(grads, refs) -> dict:
    return {
        n: ((g.double() - r).abs().max() / r.abs().max().clamp_min(1)).item()
        for n, g, r in zip(("dq", "dk", "dv"), grads, refs, strict=True)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="diag_cudnn_backward.json")
    args = parser.parse_args()
    from tokenring_xdit.ring.kernels import PAIRS, row_delta
    from tokenring_xdit.ring.tensor_layout import BHSD
    from tokenring_xdit.ring.kernels.standin import out_standin_bhsd

    res: dict = {}
    for dtype in (torch.bfloat16, torch.float16):
        for causal in (True, False):
            tag = f"{str(dtype)[6:]}-{'causal' if causal else 'full'}"
            base = 384 if causal else 400
            r = res[tag] = {}

            q, k, v, do, o, lse, refs = _case(base, dtype, causal, 1)
            delta = row_delta(do, o, BHSD)
            x = out_standin_bhsd(do, delta, o.stride())
            r["fresh_standin"] = _err(_bwd(do, q, k, v, x, lse, causal), refs)
            r["fresh_standin_again_real_o"] = _err(_bwd(do, q, k, v, o, lse, causal), refs)

            q, k, v, do, o, lse, refs = _case(base + 128, dtype, causal, 2)
            # same values and footprint, other strides: (b, s, h, d) memory seen as (b, h, s, d)
            o_perm, do_perm = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (o, do))
            delta = row_delta(do, o, BHSD)
            x = out_standin_bhsd(do, delta, o.stride())
            r["permuted_o_first"] = _err(_bwd(do_perm, q, k, v, o_perm, lse, causal), refs)
            r["permuted_o_then_dense_standin"] = _err(_bwd(do, q, k, v, x, lse, causal), refs)
            r["permuted_o_then_dense_real_o"] = _err(_bwd(do, q, k, v, o, lse, causal), refs)
            xp = out_standin_bhsd(do_perm, delta, o_perm.stride())
            r["permuted_o_then_permuted_standin"] = _err(
                _bwd(do_perm, q, k, v, xp, lse, causal), refs
            )
            r["pair_standin_after_permuted"] = _err(
                PAIRS["cudnn"].run_backward(
                    do, q, k, v, None, lse, delta, q.shape[-1] ** -0.5, BHSD, causal
                ),
                refs,
            )

            q, k, v, do, o, lse, refs = _case(base + 256, dtype, causal, 3)
            delta = row_delta(do, o, BHSD)
            x = out_standin_bhsd(do, delta, o.stride())
            r["dense_o_first"] = _err(_bwd(do, q, k, v, o, lse, causal), refs)
            r["dense_o_then_standin"] = _err(_bwd(do, q, k, v, x, lse, causal), refs)

            q, k, v, do, o, lse, refs = _case(base + 384, dtype, causal, 4)
            do_bshd = do.transpose(1, 2).contiguous().transpose(1, 2)
            r["do_dense_first"] = _err(_bwd(do, q, k, v, o, lse, causal), refs)
            r["do_bshd_strides_next"] = _err(_bwd(do_bshd, q, k, v, o, lse, causal), refs)

            q, k, v, do, o, lse, refs = _case(base + 512, dtype, causal, 5)
            big = torch.zeros(o.shape[0], o.shape[1], 2 * o.shape[2], o.shape[3], **_like(o))
            o_sliced = big[:, :, : o.shape[2]].copy_(o)
            delta = row_delta(do, o, BHSD)
            scale = q.shape[-1] ** -0.5
            pair = PAIRS["cudnn"]
            r["pair_sliced_o_first"] = _err(
                pair.run_backward(do, q, k, v, o_sliced, lse, None, scale, BHSD, causal), refs
            )
            r["pair_standin_next"] = _err(
                pair.run_backward(do, q, k, v, None, lse, delta, scale, BHSD, causal), refs
            )
            print(tag, json.dumps(r, indent=1), flush=True)
    result = dict(
        machine=platform.node(),
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        cudnn=torch.backends.cudnn.version(),
        results=res,
    )
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


def _like(t):
    return dict(dtype=t.dtype, device=t.device)


if __name__ == "__main__":
    main()
