"""diffusers' context-parallel path with TokenRing on one GPU (NCCL, bf16).

python -m pytest -m gpu tests/gpu/test_gpu_diffusers.py -q -s

diffusers' config refuses context parallelism on one rank, so the patched path's body
(tokenring_xdit.hosts.diffusers.context_parallel_attention, what the `diffusers.cp_ring` patch
calls) runs on a ring of one rank: each backend's own forward op is TokenRing's block kernel
(cuDNN, torch flash, flash-attn when installed), compared with exact fp32 attention; 'native'
(no lse) must be refused with a message that names backends that work. The same function runs on
CPU in tests/diffusers/test_diffusers_patches.py.
"""

from __future__ import annotations

import functools

import pytest
import torch

from tests.diffusers import workers
from tests.harness import run_ranks, values

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

BF16_TOL = 2e-2  # |out - exact| on O(1) attention outputs, and |lse - exact|


def _rank(rank: int, world_size: int) -> dict:
    import tokenring_xdit

    tokenring_xdit.install()  # the GPU machine may carry the package on PYTHONPATH only
    from diffusers.models.attention_dispatch import _CAN_USE_FLASH_ATTN

    backends = ["_native_cudnn", "_native_flash", "native"] + ["flash"] * _CAN_USE_FLASH_ATTN
    return workers.ring_degree_one("cuda", torch.bfloat16, backends)


@functools.cache
def _launch() -> dict:
    return values(run_ranks(_rank, 1, timeout=300, backend="nccl"))[0]


@pytest.mark.parametrize("backend", ["_native_cudnn", "_native_flash", "flash"])
def test_backend_op_is_the_block_kernel_bf16(backend: str) -> None:
    result = _launch().get(backend)
    if result is None:
        pytest.skip(f"{backend}: not available on this machine (flash-attn not installed)")
    assert "error" not in result, result
    assert result["out_err"] < BF16_TOL and result["lse_err"] < BF16_TOL, result
    assert result["lse_shape"] == (2, 300, 4) and result["dtype"] == "torch.bfloat16", result
    assert result["calls"] == 1, result


def test_backend_without_lse_is_refused() -> None:
    error = _launch()["native"]["error"]
    assert "log-sum-exp" in error and "'native'" in error, error
    assert "_native_cudnn" in error, error
