"""The packed kernel `auto` runs (kernels/registry.auto_doc_kernel), computed on the CPU for a CUDA
half-precision call (device type "cuda" given, no CUDA launched; which kernels work is passed in,
as the probe would answer) from the priced order a call's preparation passes
(packed.kernel_order): the cost model's fastest pair on the committed rows, the usable kernels
only, "masked" off CUDA half, a pure function of the agreed documents, ring size and layout; the
CPU call's record does not change with it; named kernels keep their meaning."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from tokenring_xdit.ring.kernels import MASKED, doc_pair, select_pair
from tokenring_xdit.ring.kernels.registry import auto_doc_kernel
from tokenring_xdit.ring.packed import PRICED as KERNELS
from tokenring_xdit.ring.packed import Documents, kernel_order
from tokenring_xdit.ring.packed import pick as documents
from tokenring_xdit.ring.packed.cost import load_kernels
from tokenring_xdit.ring.packed.doc_split import CONTIGUOUS, DOCUMENTS, ROW
from tokenring_xdit.ring.seam.kernel_choice import resolve_kernel
from tokenring_xdit.ring.tensor_layout import BSHD

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "benchmarks" / "packed-replays-h200-2026-11"
ROWS = {r["tokens"]: tuple(r["cu_seqlens"])
        for r in json.loads((RESULTS / "packed_ring_4gpu.json").read_text())["rows"]}  # fmt: skip


def every(name: str) -> bool:
    return True


@pytest.mark.parametrize("tokens", [32768, 131072])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_half_runs_the_models_fastest_kernel_for_the_layout(tokens, dtype):
    """Ring 4 of the measured rows, a packing run again and again (cuDNN's plans built): the
    zigzag's few segments per rank go to cuDNN per segment (measured 11.59 / 25.30 ms vs
    flash_varlen's 12.76 / 34.23), the documents layout's 63-252 to flash_varlen (17.25 / 43.55
    vs cuDNN's 48.77 / 161.97). On a new packing, as a training step has, cuDNN first builds a
    plan per segment shape (measured 50-145 ms a call over 8-16 layers against flash_varlen's
    10-34): auto picks flash_varlen for every layout, and the contiguous layout (measured
    9.31 / 27.06 ms against the zigzag's 11.28 / 33.43 with flash_varlen; cuDNN per segment,
    plans built, 7.09 / 19.06: 4 x H200, 2026-11-27)."""
    docs = Documents(ROWS[tokens])
    warm = {k: dataclasses.replace(c, plan_ms=0.0) for k, c in load_kernels().items()}
    assert documents.kernel_order(docs, 4, True, ROW, cost=warm)[0] == "cudnn"
    assert documents.kernel_order(docs, 4, True, DOCUMENTS, cost=warm)[0] == "flash_varlen"
    assert documents.kernel_order(docs, 4, True, CONTIGUOUS, cost=warm)[0] == "cudnn"
    for split in (ROW, DOCUMENTS, CONTIGUOUS):
        assert auto_doc_kernel("cuda", dtype, kernel_order(docs, 4, True, split), every) == (
            "flash_varlen"
        )
    assert documents.pick(docs, 4, True) == (CONTIGUOUS, "flash_varlen")


def test_only_kernels_that_work_here_are_picked():
    row = kernel_order(Documents(ROWS[32768]), 4, True, ROW)
    assert auto_doc_kernel("cuda", torch.bfloat16, row, lambda n: n != "cudnn") == "flash_varlen"
    assert auto_doc_kernel("cuda", torch.bfloat16, row, lambda n: n == "cudnn") == "cudnn"
    assert auto_doc_kernel("cuda", torch.bfloat16, row, lambda n: False) is None  # dense auto
    assert auto_doc_kernel("cuda", torch.bfloat16, KERNELS, every) == "flash_varlen"  # no documents


@pytest.mark.parametrize(("device", "dtype"), [("cpu", torch.bfloat16), ("cpu", torch.float32),
                                               ("cuda", torch.float32)])  # fmt: skip
def test_off_cuda_half_it_is_the_masked_kernel(device, dtype):
    row = kernel_order(Documents(ROWS[131072]), 4, True, ROW)
    assert auto_doc_kernel(device, dtype, row, every) == "masked"


def test_the_pick_is_a_function_of_the_agreed_values_only():
    """Equal documents built apart, in any order, after the caches are cleared: equal picks;
    the layout and the ring size are part of what it depends on."""
    keys = [(t, n, s) for t in sorted(ROWS) for n in (2, 4, 8) for s in (ROW, DOCUMENTS)]
    first = [
        auto_doc_kernel("cuda", torch.bfloat16, kernel_order(Documents(ROWS[t]), n, True, s), every)
        for t, n, s in keys
    ]
    documents._split_ms.cache_clear()
    again = [
        auto_doc_kernel(
            "cuda", torch.bfloat16, kernel_order(Documents(tuple(list(ROWS[t]))), n, True, s), every
        )
        for t, n, s in reversed(keys)
    ]
    assert first == again[::-1]
    assert set(first) == {"flash_varlen"}  # new packings (test above): never cuDNN's plan builds
    # with the plans built both kernels are picked, and as deterministically
    warm = {k: dataclasses.replace(c, plan_ms=0.0) for k, c in load_kernels().items()}
    built = [
        documents.kernel_order(Documents(ROWS[t]), n, True, s, cost=warm)[0] for t, n, s in keys
    ]
    documents._split_ms.cache_clear()
    rebuilt = [
        documents.kernel_order(Documents(tuple(list(ROWS[t]))), n, True, s, cost=warm)[0]
        for t, n, s in reversed(keys)
    ]
    assert built == rebuilt[::-1] and set(built) == {"cudnn", "flash_varlen"}


def test_rows_the_layout_cannot_cut_get_the_first_kernel_not_an_error():
    """The input check names a row that does not split; the kernel choice must not raise first."""
    docs = Documents((0, 5, 30))
    assert documents.kernel_order(docs, 4, True, DOCUMENTS)[0] == "flash_varlen"
    assert documents.kernel_order(docs, 4, True, ROW)[0] == "flash_varlen"


def test_the_cpu_call_keeps_the_masked_record_whatever_cuda_would_pick():
    cpu = torch.device("cpu")

    def dense(name):
        return select_pair(name, cpu, torch.float32, 8, 8, False)

    row = kernel_order(Documents(ROWS[32768]), 4, True, ROW)  # cuDNN on CUDA half
    assert doc_pair("auto", cpu, torch.float32, 8, 8, dense, row) is MASKED
    assert doc_pair("auto", cpu, torch.bfloat16, 8, 8, dense, row) is MASKED
    q = torch.zeros(1, 8192, 4, 8)
    for r in (KERNELS, row):
        got = resolve_kernel("auto", None, q, q, q, BSHD, train=True, deterministic=False,
                             packed=True, order=r)  # fmt: skip
        assert got.family == ("pair", "masked", False)
    # by name: unchanged (flash_varlen needs CUDA half; masked is masked)
    assert doc_pair("masked", cpu, torch.float32, 8, 8, dense, row) is MASKED
    with pytest.raises(ValueError, match="flash_varlen"):
        doc_pair("flash_varlen", cpu, torch.float32, 8, 8, dense, row)
