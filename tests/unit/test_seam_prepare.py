"""One definition of a call's options (ring/seam/prepare.py): the public keyword arguments and the
compiled operator's schema are both derived from it or checked against it."""

from __future__ import annotations

import dataclasses
import inspect

import torch

from tokenring_xdit.config import RingConfig
from tokenring_xdit.ring.api import token_ring_attn
from tokenring_xdit.ring.seam import compiled_op as compiled  # noqa: F401  (registers tokenring::attn)
from tokenring_xdit.ring.seam import prepare as call


def test_token_ring_attn_keywords_are_the_options():
    params = inspect.signature(token_ring_attn).parameters
    keywords = {n: p.default for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
    fields = {f.name: f.default for f in dataclasses.fields(call.CallOptions)}
    assert keywords == fields


def test_operator_schema_is_derived_from_the_options():
    schema = torch.ops.tokenring.attn.default._schema
    names = [a.name for a in schema.arguments]
    carried = [name for name, _ in call.op_args()]
    assert names == ["q", "k", "v", *carried, "train", "host", "validate"]
    backward = [a.name for a in torch.ops.tokenring.attn_backward.default._schema.arguments]
    assert backward == ["dout", "q", "k", "v", "out", "lse", "dlse", *carried, "validate"]
    # every option but the callable kernel's graph key travels
    left = {f.name for f in dataclasses.fields(call.CallOptions)} - set(carried)
    assert left == {"kernel_key"}


def test_options_round_trip_through_the_operator_arguments():
    cfg = RingConfig(timeout=7.5, final_chunks=3, defer_own=None, transport="auto")
    options = call.CallOptions(
        layout="bhsd", softmax_scale=0.25, causal=True, kernel="math", final_chunks=2,
        joint_strategy="front", cuda_graph=False, config=cfg, deterministic=True,
        cu_seqlens=[0, 3, 8],
    )  # fmt: skip
    args = [op.encode(getattr(options, name)) for name, op in call.op_args()]
    back = compiled._options(args)
    for name, _ in call.op_args():
        got, want = getattr(back, name), getattr(options, name)
        if name == "cu_seqlens":
            assert got.tolist() == want
        else:
            assert got == want, name
    assert back.config == cfg and call.op_args()  # the whole config, not just some fields


def test_a_callable_kernel_is_refused_by_name():
    try:
        call.refuse_callable_kernel(lambda *a: None)
    except NotImplementedError as exc:
        assert "kernel by name" in str(exc)
    else:
        raise AssertionError("a callable kernel was carried")
