"""The flash-attn 4 record on CPU: registered by name, never in `auto`'s order, refused with one
clear error where its package is missing, and flash-attn 4's bare `flash_attn` namespace is not
mistaken for flash-attn 2."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from tokenring_xdit.ring.kernels import REGISTRY, registry, select_pair
from tokenring_xdit.ring.kernels.fa4 import has_fa4
from tokenring_xdit.ring.kernels.flashattn import has_flash_attn
from tokenring_xdit.ring.kernels.names import AUTO, KernelName
from tokenring_xdit.ring.seam.kernel_choice import resolve_kernel
from tokenring_xdit.ring.tensor_layout import BSHD


def test_fa4_is_registered_but_never_auto():
    record = REGISTRY["fa4"]
    assert KernelName.FA4.devices == ("cuda",)
    assert record.half_only and record.backward is not None
    assert record.deterministic_backward is not None  # its deterministic mode, on request
    for order in AUTO.values():
        assert "fa4" not in order
    for train in (False, True):
        assert "fa4" not in registry.auto_order(torch.device("cpu"), torch.bfloat16, train)


@pytest.fixture
def fa4_missing(monkeypatch):
    missing = dataclasses.replace(REGISTRY["fa4"], installed=lambda: False)
    monkeypatch.setitem(REGISTRY, "fa4", missing)


def test_fa4_without_its_package_is_refused_before_any_step(fa4_missing):
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="needs the flash-attn-4 package"):
        select_pair("fa4", cpu, torch.bfloat16, 64, 64, False)
    with pytest.raises(ValueError, match="needs the flash-attn-4 package"):
        registry.select_kernel("fa4", cpu, torch.bfloat16, 64, 64)
    q = torch.zeros(1, 8, 2, 64, dtype=torch.bfloat16)
    for train in (False, True):
        choice = resolve_kernel(
            "fa4", None, q, q, q, BSHD, train=train, deterministic=False, packed=False
        )
        assert choice.fn is None and "flash-attn-4" in choice.problem_text


def test_flash_attn_4_alone_is_not_flash_attn_2(tmp_path, monkeypatch):
    # what the flash-attn-4 wheel installs: flash_attn/cute/..., no flash_attn/__init__.py
    (tmp_path / "flash_attn" / "cute").mkdir(parents=True)
    (tmp_path / "flash_attn" / "cute" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "flash_attn" or m.startswith("flash_attn.")]:
        monkeypatch.delitem(sys.modules, name)
    try:
        assert has_fa4()
        assert not has_flash_attn()
        # and flash-attn 2's own module next to it counts again
        (tmp_path / "flash_attn" / "flash_attn_interface.py").write_text("")
        assert has_flash_attn()
    finally:
        sys.modules.pop("flash_attn", None)
        sys.modules.pop("flash_attn.cute", None)


def test_fa4_benchmark_times_each_ring_block_once():
    from benchmarks.diagnostics.fa4_vs_cudnn import blocks

    got = blocks([16384, 32768], [2, 4])
    # ring 2 over 16k and ring 4 over 32k share their blocks (8k diagonal, 4k x 8k off-diagonal)
    assert got == [
        ("half", 2048, 4096, False), ("diag", 4096, 4096, True), ("full", 4096, 4096, False),
        ("half", 4096, 8192, False), ("diag", 8192, 8192, True), ("full", 8192, 8192, False),
        ("half", 8192, 16384, False), ("diag", 16384, 16384, True),
        ("full", 16384, 16384, False),
    ]  # fmt: skip
