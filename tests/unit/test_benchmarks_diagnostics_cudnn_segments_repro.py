"""The bookkeeping of benchmarks/diagnostics/cudnn_segments_repro.py on CPU: with the exact
`math` kernel in place of cuDNN, every case's per-segment loop (views or copies, orders, own or
exact lse, stand-in or real O, poisoned gaps, NaN after the lse, storage offsets, GQA, both
layouts) and the product wrapper agree with fp64 attention of each document alone, so a
failing line on the GPU is the kernel's, not the repro's."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from benchmarks.diagnostics import cudnn_segments_repro as repro

CASES = repro.cases()
# one case per code path of the loop (the other lengths run the same code with other segments)
PATHS = {
    "product", "product-raw", "base", "b1", "bhsd", "gqa", "contiguous", "interleave", "reverse",
    "own-lse", "real-o", "poison-gaps", "lse-tail-nan", "offset-16B", "keep-alive",
    "full-568x500", "single-17x17-causal",
}  # fmt: skip


def test_cases_are_well_formed():
    names = [c.name for c in CASES]
    assert PATHS <= set(names)
    assert len(names) == len(set(names)) and names[:4] == [
        "product-raw",
        "product",
        "product-flash",
        "base",
    ]
    for case in CASES:
        for seg in case.segs:
            assert 0 <= seg.q0 < seg.q1 <= case.s and 0 <= seg.k0 < seg.k1 <= case.s
            if seg.causal:  # a document's own tokens on both sides
                assert (seg.q0, seg.q1) == (seg.k0, seg.k1)
    rows, keys = repro.covered(repro.BASE_SEGS, 768)
    assert int(rows.sum()) == int(keys.sum()) == 700 and not rows[700:].any()


@pytest.mark.parametrize("case", [c for c in CASES if c.name in PATHS], ids=lambda c: c.name)
def test_every_path_is_exact_with_the_exact_kernel(case):
    result = repro.run_case(repro.for_cpu(case), "cpu")
    assert result["verdict"] == "ok", result
    assert not any(result[f"{n}_nan"] for n in ("out", "lse", "dq", "dk", "dv"))


def test_poisoned_inputs_hold_nan_exactly_outside_the_documents():
    case = next(c for c in CASES if c.name == "poison-gaps")
    q, k, _, do = repro.inputs(dataclasses.replace(case, dtype=torch.float32), "cpu")
    rows, keys = repro.covered(case.segs, case.s)
    for x, inside in ((q, rows), (k, keys), (do, rows)):
        nan_tokens = torch.isnan(x).any(dim=-1).any(dim=-1).any(dim=0)  # (s,) in BSHD
        assert torch.equal(nan_tokens, ~inside)


def test_a_wrong_kernel_is_caught():
    """The verdict is not unconditional: a kernel whose backward drops dK fails it."""
    from tokenring_xdit.ring.kernels import MATH

    def no_dk(*args):
        dq, dk, dv = MATH.backward(*args)
        return dq, torch.zeros_like(dk), dv

    broken = dataclasses.replace(MATH, backward=no_dk)
    case = dataclasses.replace(repro.for_cpu(next(c for c in CASES if c.name == "base")), b=1)
    q, k, v, do = repro.inputs(case, "cpu")
    ref = repro.reference(case, q, k, v, do)
    got = repro.run_segments(case, broken, q, k, v, do, ref[1].float())
    verdict = repro.errors(got, ref, repro.covered(case.segs, case.s)[0])["verdict"]
    assert verdict == "FAIL dk"


def test_the_script_writes_its_json(tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    argv = ["x", "--cpu-check", "--only", "single-3x3-causal,single-2x2-causal", "--out", str(out)]
    monkeypatch.setattr("sys.argv", argv)
    repro.main()
    res = json.loads(out.read_text())
    assert set(res["cases"]) == {"single-3x3-causal", "single-2x2-causal"}
    assert res["summary"]["single_dense_calls"] == {n: "ok" for n in res["cases"]}
