"""The Triton merge (ring/merge/fused.py) on the CPU, through Triton's interpreter.

The GPU test (tests/gpu/test_gpu_token_ring.py) checks it against the torch merge on real
hardware; here the same kernel source runs under TRITON_INTERPRET=1 in a child process (the
switch is read when the kernel is made), so its indexing is checked on every CI run: both
layouts, head sizes that do and do not fill the tile, fp32 and bf16, in place (out aliases a,
lse_out aliases lse_a, as in the ring's merges) and every access width `vector_width` picks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import torch

from tests.speed import scaled
from tokenring_xdit.ring.merge.fused import vector_width

_CHILD = textwrap.dedent(
    """
    import torch
    from tokenring_xdit.ring.merge import fused as fused_merge

    gen = torch.Generator().manual_seed(0)
    worst = {}
    # (shape in storage order, permutation to (b, h, s, d), dtype, slice of s or None)
    cases = [
        ((2, 3, 37, 72), (0, 1, 2, 3), torch.float32, None),
        ((2, 37, 3, 72), (0, 2, 1, 3), torch.bfloat16, None),  # bshd storage
        ((2, 37, 3, 72), (0, 2, 1, 3), torch.bfloat16, slice(5, 30)),  # rows of a larger one
        ((1, 2, 19, 64), (0, 1, 2, 3), torch.bfloat16, None),
        ((2, 3, 11, 37), (0, 1, 2, 3), torch.float32, slice(1, 10)),  # odd size: 1 element
        ((1, 4, 9, 6), (0, 1, 2, 3), torch.bfloat16, None),  # d=6: 2-element accesses
    ]
    for i, (shape, perm, dtype, rows) in enumerate(cases):
        a, b = (torch.randn(shape, generator=gen).to(dtype).permute(perm) for _ in range(2))
        la, lb = (4 * torch.randn(a.shape[:3], generator=gen) for _ in range(2))
        lb[0, 0, :3] = float("-inf")  # an empty partial weighs nothing
        if rows is not None:
            a, b, la, lb = a[:, :, rows], b[:, :, rows], la[:, :, rows], lb[:, :, rows]
        a0, la0 = a.clone(), la.clone()
        fused_merge.merge2_bhsd(a, la, a, la, b, lb)  # in place, as the ring merges
        lse = torch.logaddexp(la0, lb)
        wa, wb = (torch.exp(x - lse)[..., None] for x in (la0, lb))
        ref = a0.float() * wa + b.float() * wb
        ulp = 1e-5 if dtype == torch.float32 else 2 ** -7 * ref.abs().max().item()
        out_err = (a.float() - ref).abs().max().item() / ulp
        lse_err = (la - lse).abs().max().item()
        worst[i] = (fused_merge.vector_width(a.shape[3], a, b), out_err, lse_err)
    print(worst)
    """
)


def test_merge_kernel_interpreted():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=root)
    run = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=scaled(300)
    )
    assert run.returncode == 0, run.stderr[-3000:]
    worst = eval(
        run.stdout.strip().splitlines()[-1]
    )  # {case: (width, out error in ulps, lse error)}
    widths = [w for w, _, _ in worst.values()]
    assert widths == [4, 8, 8, 8, 1, 2], widths  # every access width is exercised
    for case, (_, out_ulps, lse_err) in worst.items():
        assert out_ulps <= 1.0, (case, out_ulps)
        assert lse_err <= 1e-5, (case, lse_err)


def test_vector_width_rules():
    x = torch.empty(2, 3, 16, 72, dtype=torch.bfloat16)
    assert vector_width(72, x, x) == 8  # 16 bytes of bf16
    assert vector_width(72, x, x.float()) == 4  # 16 bytes of the widest dtype
    assert vector_width(72, x[:, :, 1:]) == 8  # rows start 72 elements apart: still 16 bytes
    assert vector_width(72, x[..., 1:].unflatten(3, (71, 1))[..., 0]) == 1  # odd start and size
    assert vector_width(72, x.transpose(2, 3).transpose(2, 3)) == 8
    y = torch.empty(2, 16, 3, 72, dtype=torch.bfloat16).transpose(1, 2)  # bshd storage
    assert vector_width(72, y) == 8
    assert vector_width(72, torch.empty(2, 3, 72, 16).transpose(2, 3)) == 1  # d not unit-stride
