"""The diffusers patch set on its own (one fresh process; no process group needed beyond it):
lazy arming from the `diffusers` entry point, the table rows, the block kernel, exact undo."""

from __future__ import annotations

import pytest

from tests.diffusers import workers
from tests.harness import run_ranks, values
from tokenring_xdit import _bootstrap
from tokenring_xdit.patches import HOOKS
from tokenring_xdit.patches.base import UnsupportedHostVersion


@pytest.fixture(scope="module")
def single() -> dict:
    return values(run_ranks(workers.single, 1, env=workers.ENV, timeout=180))[0]


def test_armed_on_import_diffusers_but_applied_with_the_dispatcher(single):
    assert "diffusers" in _bootstrap.TRIGGERS and "diffusers" in HOOKS
    assert single["lazy"] and not single["active_after_import_diffusers"]
    assert single["applied"] == ["diffusers.cp_ring", "diffusers.cp_setup"]


def test_every_diffusers_patch_point_is_in_the_table(single):
    assert single["table"] == single["applied"] + single["cpu_applied"]
    assert all(i.startswith("diffusers_cpu.") for i in single["cpu_applied"])


def test_block_kernel_is_diffusers_forward_op_with_lse(single):
    assert single["kernel_err"] < 1e-5
    assert single["lse_shape"] == (2, 3, 7)  # (b, h, s), from diffusers' (b, s, h)
    assert "'native'" in single["no_lse"] and "_native_cudnn" in single["no_lse"]


def test_uninstall_and_disable_restore_diffusers_exactly(single):
    assert single["restored"] == dict.fromkeys(single["restored"], True)
    assert set(single["restored"]) == {
        "cp",
        "flash_fwd",
        "flash_bwd",
        "gather",
        "sizes",
        "sizes_dispatch",
        "sizes_hooks",
        "setup",
        "resolve",
    }
    assert single["sizes_aliased"]


def test_other_signatures_are_refused():
    from tokenring_xdit.patches.diffusers import _CP_PARAMS, _check_parameters

    def templated(query, key, value, attn_mask=None, *, forward_op, backward_op):
        pass

    with pytest.raises(UnsupportedHostVersion, match="nothing of diffusers was patched"):
        _check_parameters(templated, _CP_PARAMS)


def test_ring_degree_one_runs_the_backend_op_and_refuses_native(single):
    flash, native = single["ring_degree_one"]["_native_flash"], single["ring_degree_one"]["native"]
    assert flash["out_err"] < 1e-5 and flash["lse_err"] < 1e-5, flash
    assert flash["lse_shape"] == (2, 300, 4) and flash["dtype"] == "torch.float32", flash
    assert flash["calls"] == 1, flash
    assert "log-sum-exp" in native["error"] and "'native'" in native["error"], native


@pytest.mark.parametrize(
    "accelerator, count, seen",
    [
        (None, 0, 1),  # a CPU build of torch
        ("cuda", 0, 1),  # a CUDA build on a machine without a GPU (the ZeroDivisionError case)
        ("cuda", 2, 2),  # a GPU machine: the real count, untouched
    ],
)
def test_device_index_shim_decides_by_devices_not_by_build(monkeypatch, accelerator, count, seen):
    """diffusers' `rank % torch.accelerator.device_count()` sees 1 whenever no accelerator
    device exists, whatever accelerator the build of torch reports. The build's answers are
    simulated here (this machine has one build); the CUDA-build run: scripts/cuda-build-check.sh."""
    import torch

    from tokenring_xdit.patches.diffusers_cpu import _one_device

    device = None if accelerator is None else torch.device(accelerator)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: device)
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: count)
    assert _one_device(lambda: torch.accelerator.device_count(), None, (), {}) == seen
    assert torch.accelerator.device_count() == count  # restored after the call
