"""GQA inside the ring without a process group: the K/V head mapping, the kernel wrappers (native
or expanded per block) vs fp64 attention, and what the planner / `auto` make of GQA's bytes."""

from __future__ import annotations

import pytest
import torch

from tokenring_xdit import token_ring_attn, token_ring_attn_func
from tokenring_xdit.hosts.selection import AutoSignature, decide, reset_decisions
from tokenring_xdit.planner.choose import choose_ring, ring_times
from tokenring_xdit.planner.schedules import Block
from tokenring_xdit.ring import kernels
from tokenring_xdit.ring.kernels import KERNELS, PAIRS
from tokenring_xdit.ring.tensor_layout import BHSD, BSHD

TOL = 2e-5


@pytest.mark.parametrize("layout", [BSHD, BHSD])
def test_query_head_i_uses_kv_head_i_over_g_and_grads_fold_back(layout):
    kv = torch.randn(2, 3, 5, 4) if layout is BHSD else torch.randn(2, 5, 3, 4)
    wide = kernels.expand_kv(kv, 4, layout)
    assert wide.shape[layout.head_dim] == 12
    for i in range(12):
        assert torch.equal(wide.select(layout.head_dim, i), kv.select(layout.head_dim, i // 4))
    # dK of expanded K summed over each group: here every copy has gradient 1 -> 4
    folded = kernels.fold_kv_grad(torch.ones_like(wide), 4, layout, torch.float32)
    assert folded.shape == kv.shape and torch.equal(folded, torch.full_like(kv, 4.0))
    assert kernels.kv_groups(wide, kv, layout) == 4


def test_the_probe_finds_which_kernels_take_gqa_themselves():
    cpu, f32 = torch.device("cpu"), torch.float32
    # torch's CPU flash ops take fewer K/V heads (forward and backward); the math pair does not
    assert kernels.gqa_pair(PAIRS["cpu_flash"], cpu, f32, 16, 16) is PAIRS["cpu_flash"]
    assert kernels.gqa_pair(PAIRS["math"], cpu, f32, 16, 16) is not PAIRS["math"]
    fn, key = kernels.gqa_kernel(KERNELS["math"], "math", cpu, f32, 16, 16)
    assert fn is not KERNELS["math"] and key == ("gqa-expanded", "math")
    assert (
        kernels.gqa_kernel(KERNELS["cpu_flash"], "cpu_flash", cpu, f32, 16, 16)[0]
        is KERNELS["cpu_flash"]
    )


@pytest.mark.parametrize("kv_heads", [2, 1])
@pytest.mark.parametrize("kernel", ["auto", "math"])
@pytest.mark.parametrize("causal", [True, False])
def test_one_rank_gqa_matches_fp64(kv_heads, kernel, causal):
    gen = torch.Generator().manual_seed(kv_heads)
    q, do = (torch.randn(2, 4, 12, 16, generator=gen, dtype=torch.float64) for _ in "qo")
    k, v = (torch.randn(2, kv_heads, 12, 16, generator=gen, dtype=torch.float64) for _ in "kv")
    ref_in = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = torch.nn.functional.scaled_dot_product_attention(
        *ref_in, is_causal=causal, enable_gqa=True
    )
    ref.backward(do)
    got_in = [x.float().requires_grad_() for x in (q, k, v)]
    out = token_ring_attn_func(*got_in, causal=causal, layout="bhsd", kernel=kernel)
    out.backward(do.float())
    assert (out.double() - ref).abs().max() <= TOL
    for g, r in zip(got_in, ref_in, strict=True):
        assert g.grad.shape == r.shape
        assert (g.grad.double() - r.grad).abs().max() <= TOL
    if not causal:
        with torch.no_grad():
            inf, _ = token_ring_attn(*(x.float() for x in (q, k, v)), layout="bhsd", kernel=kernel)
        assert (inf.double() - ref).abs().max() <= TOL


def test_kv_heads_that_do_not_divide_the_query_heads_are_refused():
    q, k = torch.randn(1, 8, 4, 16), torch.randn(1, 8, 3, 16)
    with pytest.raises(ValueError, match="one head count that divides q's"):
        token_ring_attn_func(q, k, k)


# --- planner / auto ---------------------------------------------------------------------------


def test_gqa_shrinks_the_kv_ring_bytes_not_tokenrings():
    mha = Block(heads=64, head_dim=128, q_len=4096, kv_len=4096)
    g8 = Block(heads=64, head_dim=128, q_len=4096, kv_len=4096, kv_heads=8)
    assert g8.kv_bytes * 8 == mha.kv_bytes
    assert (g8.q_bytes, g8.partial_bytes) == (mha.q_bytes, mha.partial_bytes)
    # per call, TokenRing moves g x (1 + 2 / (head_dim x 2 bytes)) times what a K/V ring moves
    ratio = (g8.q_bytes + g8.partial_bytes) / g8.kv_bytes
    assert ratio == pytest.approx(8 * (1 + 2 / 256))


def test_auto_picks_the_kv_ring_where_gqa_makes_it_cheaper():
    args = (64, 128, 4096, 4096, 4)  # Llama-3 70B heads, 16k tokens over 4 GPUs
    tr1, ag1 = ring_times(*args)
    tr8, ag8 = ring_times(*args, kv_heads=8)
    assert tr8 == tr1 and ag8 < ag1  # TokenRing's traffic does not shrink, the K/V ring's does
    assert choose_ring(*args) == "token_ring"
    assert choose_ring(*args, kv_heads=8) == "default"
    reset_decisions()
    common = dict(batch=1, heads=64, head_dim=128, q_len=4096, kv_len=4096, ring=4,
                  dtype="bfloat16", device_type="cuda", device_name="NVIDIA H200",
                  fabric="nvswitch", graphs=True)  # fmt: skip
    assert decide(AutoSignature(**common)).impl == "token_ring"
    assert decide(AutoSignature(**common, kv_heads=8)).impl == "default"
