"""The `cudnn` record sends blocks with one query or one key to torch flash (torch's SDPA
dispatcher never gives cuDNN a key length of 1, and every failure of cuDNN per document segment
had such a block: docs/kernels-cudnn-segments.md). Checked on CPU by which op each block
reaches; the ops themselves run on the GPU (benchmarks/diagnostics/cudnn_segments_repro.py)."""

from __future__ import annotations

import pytest
import torch

from tokenring_xdit.ring.kernels import REGISTRY, sdpa
from tokenring_xdit.ring.tensor_layout import BHSD, BSHD


@pytest.fixture
def calls(monkeypatch):
    seen = []
    for name in ("flash_forward", "cudnn_op_forward", "flash_backward", "cudnn_op_backward"):
        monkeypatch.setattr(sdpa, name, lambda *a, _n=name: seen.append(_n) or _n)
    return seen


@pytest.mark.parametrize("layout", [BSHD, BHSD], ids=lambda x: x.name)
@pytest.mark.parametrize(
    "s_q,s_k,op", [(1, 1, "flash"), (1, 43, "flash"), (9, 1, "flash"), (2, 2, "cudnn_op"),
                   (64, 17, "cudnn_op")],
)  # fmt: skip
def test_one_token_blocks_go_to_flash(calls, layout, s_q, s_k, op):
    q = layout.from_bhsd(torch.zeros(1, 2, s_q, 8))
    k = layout.from_bhsd(torch.zeros(1, 2, s_k, 8))
    cudnn = REGISTRY["cudnn"]
    assert cudnn.forward(q, k, k, 0.5, layout, False) == f"{op}_forward"
    assert cudnn.backward(q, q, k, k, None, None, None, 0.5, layout, False) == f"{op}_backward"
    assert calls == [f"{op}_forward", f"{op}_backward"]
