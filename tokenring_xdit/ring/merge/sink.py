"""Attention sinks (GPT-OSS's per-head `sinks`): a logit every query also attends, with no value.

A sink adds exp(s_h) to the softmax denominator of every row of head h, so after the ring has
merged a query's partials (out, lse) it enters once, exactly:

    lse' = logaddexp(lse, s_h);   out' = out * exp(lse - lse')

Applied to the ring's result rather than inside it, it costs one pass over out and travels
nowhere. Its gradients (of out, lse and the sink) are autograd's through these ops; the ring's
backward takes the gradient of lse (training/backward.py: fold_lse_grad).
"""

from __future__ import annotations

import torch

from ..tensor_layout import Layout, get_layout

__all__ = ["add_attention_sink"]


def add_attention_sink(
    out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor, layout: str | Layout = "bshd"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of attention whose softmax also counts a per-head sink logit.

    out: the ring's output in `layout`; lse: its (batch, heads, seqlen) fp32 log-sum-exp;
    sinks: (heads,) logits (any float dtype; GPT-OSS keeps them in the model's dtype).
    """
    lay = get_layout(layout)
    heads = lse.shape[1]
    if sinks.dim() != 1 or sinks.shape[0] != heads:
        raise ValueError(
            f"sinks must be one logit per query head, shape ({heads},); got {tuple(sinks.shape)}"
        )
    acc = torch.float64 if lse.dtype == torch.float64 else torch.float32
    lse = lse.to(acc)
    new_lse = torch.logaddexp(lse, sinks.to(device=lse.device, dtype=acc).view(1, -1, 1))
    weight = lay.lse_to_out(torch.exp(lse - new_lse))
    return (out.to(acc) * weight).to(out.dtype), new_lse
