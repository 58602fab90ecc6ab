"""The kernel names' table (ring/kernels/names.py): importable without torch, every line's
record found where it says and agreeing with it, and the registry, `auto`'s orders, the CLI
and the packed cost model all taking their names from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tokenring_xdit.ring.kernels import names, registry
from tokenring_xdit.ring.kernels.names import KernelName

ROOT = Path(__file__).resolve().parents[2]


def test_the_names_load_without_torch():
    """The CLI checks `--kernel` before torch loads: the names, the kernels package itself, the
    demo's arguments import no torch (the packed cost model sits behind packed/, which does)."""
    code = (
        "import sys\n"
        "import tokenring_xdit.ring.kernels.names, tokenring_xdit.ring.kernels\n"
        "import tokenring_xdit.tools.demo_cli\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_every_line_is_a_registered_record():
    records = {**registry.REGISTRY, **registry.DOC_REGISTRY}
    assert tuple(records) == tuple(k.value for k in KernelName)
    assert tuple(registry.REGISTRY) == names.DENSE == tuple(registry.KERNELS)
    assert registry.DOC_KERNELS == names.PACKED_ONLY == ("masked", "flash_varlen")
    for line in KernelName:
        record = records[line.value]
        assert record.name == line.value and record.segments == line.packed_only


def test_a_line_that_names_the_wrong_record_is_refused():
    line = SimpleNamespace(record="sdpa.CUDNN", value="torch_flash", packed_only=False)
    with pytest.raises(TypeError, match="sdpa.CUDNN is not the record"):
        registry._record(line)
    line = SimpleNamespace(record="exact.MASKED", value="masked", packed_only=False)
    with pytest.raises(TypeError, match="exact.MASKED"):
        registry._record(line)


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="'nope' is not a valid KernelName"):
        KernelName("nope")
    with pytest.raises(ValueError, match="unknown kernel 'nope'; use 'auto' or one of"):
        registry.select_kernel("nope", torch.device("cpu"), torch.float32, 16, 16)


def test_auto_orders_and_the_priced_kernels_are_registry_names():
    for order in names.AUTO.values():
        assert set(order) <= set(names.DENSE) and len(set(order)) == len(order)
    assert "fa4" not in {n for order in names.AUTO.values() for n in order}  # by name only
    assert set(names.PRICED) <= {k.value for k in KernelName}
    assert names.PRICED == ("flash_varlen", "cudnn")  # the tie order `auto` keeps


@pytest.mark.parametrize("train", [False, True])
def test_a_lines_devices_decide_what_auto_tries_on_the_cpu(train):
    got = registry.auto_order(torch.device("cpu"), torch.float32, train)
    assert got == names.runs_on("cpu") == ("cpu_flash", "math")
    assert all("cpu" in KernelName(n).devices for n in got)


def test_the_kernels_package_resolves_its_names_on_first_use():
    import tokenring_xdit.ring.kernels as kernels

    assert kernels.math is registry.KERNELS["math"]
    assert kernels.torch_cudnn is registry.KERNELS["cudnn"]
    assert kernels.KernelName is KernelName and kernels.REGISTRY is registry.REGISTRY
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        kernels.nope  # noqa: B018
