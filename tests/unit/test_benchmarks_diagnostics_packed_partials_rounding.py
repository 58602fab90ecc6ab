"""benchmarks/diagnostics/packed_partials_rounding.py at a tiny size on CPU: its blocks cover
every (query, key) pair of every document exactly once (no rounding: the ring's sums equal
fp64), the rounding counts are those of the schedule, and the script writes its JSON."""

from __future__ import annotations

import json

import torch

from benchmarks.diagnostics import packed_partials_rounding as diag
from tests.packed_blocks import blocks, max_partials

DOCS = (0, 1, 29, 30, 45, 64)  # a long document over several zigzag chunks, one-token ones


def test_without_rounding_the_blocks_sum_to_the_exact_gradients():
    res = diag.emulate(DOCS, (2, 4), h=4, hk=2, d=16, out=torch.float64)
    errs = [x["ring"] for lay in res.values() for ranks in lay.values() for g in ranks
            for x in g.values()]  # fmt: skip
    assert len(errs) == 2 * (2 + 4) * 3
    assert max(errs) <= 1e-12


def test_partial_counts_follow_the_schedule():
    """The row's zigzag at ring 4: rank 1 holds chunks 1 and 6 of 8 (8 tokens each); its keys
    in chunk 1 (inside document 1: tokens 1..28) meet query chunks 1, 2, 3 (3 partials). At
    ring 2 no key gets more than 2 blocks' partials in the zigzag."""
    bl, pos = blocks(DOCS, 4, "zigzag")
    assert pos[1].tolist() == [*range(8, 16), *range(48, 56)]
    assert max_partials(bl, 1, 16) == 3
    bl2, _ = blocks(DOCS, 2, "zigzag")
    assert max(max_partials(bl2, r, 32) for r in range(2)) == 2


def test_script_writes_its_json(tmp_path):
    out = tmp_path / "p.json"
    args = ["--out", str(out), "--rings", "2,4", "--docs", "0,1,29,30,45,64", "--heads", "4,2"]
    res = diag.main([*args, "--d", "16"])
    got = json.loads(out.read_text())
    assert got == json.loads(json.dumps(res))
    for lay in ("zigzag", "documents"):
        for n in ("2", "4"):
            ranks = got["layouts"][lay][n]
            assert len(ranks) == int(n)
            for g in ranks:
                # bf16 partials: errors of the order of a bf16 ulp, never zero
                assert all(0 < x["ring"] < 0.05 and 0 < x["whole"] < 0.05 for x in g.values())


def test_the_gpu_tests_blockwise_reference_is_the_exact_decomposition():
    """tests/gpu/test_gpu_packed.py's `_blockwise` (the ring's blocks on one device) run in
    fp32 through torch's CPU flash op: every layout and ring size gives the fp64 gradients."""
    from tests.gpu.test_gpu_packed import _blockwise, _ref
    from tokenring_xdit.ring.kernels.sdpa import _cpu_backward, _cpu_forward

    total, h, hk, d = DOCS[-1], 4, 2, 16
    gen = torch.Generator().manual_seed(3)
    q, do = (torch.randn(1, h, total, d, generator=gen) for _ in "qo")
    k, v = (torch.randn(1, hk, total, d, generator=gen) for _ in "kv")
    doc = torch.repeat_interleave(torch.arange(len(DOCS) - 1), torch.tensor(DOCS).diff())
    mask = (doc[:, None] == doc[None, :]) & torch.ones(total, total, dtype=torch.bool).tril()
    ref = [x for i, x in enumerate(_ref(q, k, v, do, mask, d**-0.5)) if i != 1]
    for n in (1, 2, 4):
        for layout in ("zigzag", "documents"):
            got = _blockwise(q, k, v, do, DOCS, n, layout, (_cpu_forward, _cpu_backward))
            for g, r in zip(got, ref, strict=True):
                assert (g.double() - r).abs().max() <= 1e-5 * r.abs().max(), (n, layout)
