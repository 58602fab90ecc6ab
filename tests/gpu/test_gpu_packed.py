"""GPU checks of packed documents (marker `gpu`, run on the GPU machine):

python -m pytest -m gpu tests/gpu/test_gpu_packed.py -q

- `auto` picks torch's flash kernel with cu_seqlens ("flash_varlen") for bf16/fp16 on CUDA
  where no documents are known, and the cost model's kernel for a row (cuDNN per segment for the
  zigzag of ring 4 on the measured 32k row, flash_varlen for its documents layout), the probe
  agreeing that both work here;
- every document pair (flash_varlen, torch flash and cuDNN per segment), MHA and GQA, both
  layouts, on a block of random documents (causal diagonal and full off-diagonal segments, rows
  that meet no key) vs fp64 masked attention: out, lse, and dq/dk/dv fed the global lse and only
  delta (the O stand-in), as the ring feeds them;
- the training loops of a ring of 1-4 ranks as threads on this GPU (tests/thread_ring.py) with
  random packed documents, causal zigzag and not;
- token_ring_attn_func at ring degree 1 with cu_seqlens, forward + backward;
- token_ring_attn_func on a real NCCL ring of every GPU, shards cut in the row's zigzag and in
  the documents layout, forward + backward vs fp64, against the same block decomposition run on
  one GPU through SDPA flash (bf16 partials summed in fp32: the decomposition's own error) and
  against each document alone through SDPA flash (one rounding per gradient), with a bound from
  the number of partials a position sums (benchmarks/diagnostics/packed_partials_rounding.py).
"""

from __future__ import annotations

import random

import pytest
import torch

from tests.harness import run_ranks, values

pytestmark = pytest.mark.gpu

TOL = 4e-2  # bf16


def _ref(q, k, v, do, mask, scale):
    """fp64 masked attention (b, h, s, d) with autograd: out, lse, dq, dk, dv."""
    g = q.shape[1] // k.shape[1]
    ins = [x.double().requires_grad_() for x in (q, k, v)]
    kb, vb = (x.repeat_interleave(g, dim=1) for x in ins[1:])
    scores = (ins[0] @ kb.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    p = torch.exp(scores - torch.where(lse.isinf(), 0, lse).unsqueeze(-1))
    out = p @ vb
    out.backward(do.double())
    return out.detach(), lse.detach(), *(x.grad for x in ins)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_auto_picks_flash_varlen(dtype):
    from tokenring_xdit.ring.kernels import doc_pair, select_pair
    from tokenring_xdit.ring.packed import PRICED

    dev = torch.device("cuda")
    pair = doc_pair(
        "auto", dev, dtype, 128, 128, lambda n: select_pair(n, dev, dtype, 128, 128, False),
        order=PRICED,  # what a call without its documents yet prices (seam/prepare.py)
    )  # fmt: skip
    assert pair.name == "flash_varlen"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_auto_picks_the_cost_models_kernel_for_the_row(dtype):
    """doc_pair("auto") on a GPU runs the kernel the cost model prices fastest for the row (a
    new packing: cuDNN pays a plan per new segment shape), on rows where it prices each one."""
    from tokenring_xdit.ring.kernels import doc_pair, select_pair
    from tokenring_xdit.ring.packed import Documents, kernel_order

    dev = torch.device("cuda")
    args = (dev, dtype, 128, 128)
    record = {"flash_varlen": "flash_varlen", "cudnn": "cudnn+segments"}
    measured = (0, 7429, 11096, 17817, 25621, 29578, 30421, 32768)  # a measured 32k row
    rows = [(measured, "zigzag"), (measured, "documents"), ((0, 40000, 65536), "zigzag")]
    picked = set()
    for bounds, split in rows:
        order = kernel_order(Documents(bounds), 4, True, split)
        want = record[order[0]]
        pair = doc_pair("auto", *args, lambda n: select_pair(n, *args, False), order)
        assert pair.name == want, (bounds, split, pair.name)
        picked.add(want)
    assert picked == set(record.values())  # the rows exercise both outcomes


def _doc_pair(name, args):
    """The packed-documents record of `name`; "cudnn+segments" is cuDNN per segment built
    directly (as doc_pair("cudnn") builds it; docs/kernels-cudnn-segments.md)."""
    from tokenring_xdit.ring.kernels import doc_pair, segments_pair, select_pair

    if name == "cudnn+segments":
        return segments_pair(select_pair("cudnn", *args, False))
    return doc_pair(name, *args, lambda n: select_pair(n, *args, False))


def test_cudnn_per_segment_is_offered_by_name():
    """cuDNN per document segment is exact once one-token blocks go to torch flash (the cases
    below): packed documents accept kernel='cudnn' by name."""
    from tokenring_xdit.ring.kernels import doc_pair, select_pair

    dev, dtype = torch.device("cuda"), torch.bfloat16
    pair = doc_pair(
        "cudnn", dev, dtype, 128, 128, lambda n: select_pair(n, dev, dtype, 128, 128, False)
    )
    assert "cudnn" in pair.name


@pytest.mark.parametrize("name", ["flash_varlen", "torch_flash", "cudnn+segments"])
@pytest.mark.parametrize("kv_heads", [8, 2])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_document_pairs_match_exact(name, kv_heads, layout):
    from tokenring_xdit.ring.kernels import gqa_pair, row_delta, segments_mask
    from tokenring_xdit.ring.segments import Segment
    from tokenring_xdit.ring.tensor_layout import get_layout

    lay, dev, dtype, d = get_layout(layout), torch.device("cuda"), torch.bfloat16, 128
    args = (dev, dtype, d, d)
    pair = _doc_pair(name, args)
    if kv_heads != 8:
        pair = gqa_pair(pair, *args)
    # diagonal-style causal runs, one full off-diagonal run, rows 700..767 see nothing
    segs = (Segment(0, 1, 0, 1, True), Segment(1, 300, 1, 300, True),
            Segment(300, 700, 300, 700, True))  # fmt: skip
    for mask_segs in (segs, (Segment(200, 768, 0, 500, False),)):
        gen = torch.Generator(device="cpu").manual_seed(4)
        q, do = (torch.randn(2, 8, 768, d, generator=gen) for _ in "qo")
        k, v = (torch.randn(2, kv_heads, 768, d, generator=gen) for _ in "kv")
        q, k, v, do = (x.to(dev, dtype) for x in (q, k, v, do))
        mask = segments_mask(mask_segs, 768, 768, dev)
        ref = _ref(q, k, v, do, mask, d**-0.5)
        ql, kl, vl, dol = (lay.from_bhsd(x).contiguous() for x in (q, k, v, do))
        out, lse = pair.run_forward(ql, kl, vl, d**-0.5, lay, mask_segs)
        seen = ~ref[1].isinf()
        assert torch.equal(lse.isinf(), ref[1].isinf())
        assert (lse[seen].double() - ref[1][seen]).abs().max() <= 1e-2
        assert (lay.to_bhsd(out).double() - ref[0]).abs().max() <= TOL
        # the ring's backward: global lse, delta instead of O (rows without keys: lse 0 there)
        glse = torch.where(lse.isinf(), torch.zeros_like(lse), lse)
        delta = row_delta(dol, out, lay)
        grads = pair.run_backward(dol, ql, kl, vl, None, glse, delta, d**-0.5, lay, mask_segs)
        for g, r in zip(grads, ref[2:], strict=True):
            err = (lay.to_bhsd(g).double() - r).abs().max() / r.abs().max().clamp_min(1)
            assert err <= TOL, (name, float(err))


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", ["flash_varlen", "torch_flash", "cudnn+segments"])
@pytest.mark.parametrize("split", ["zigzag", "documents", "contiguous"])
def test_thread_ring_with_documents_matches_exact(n, causal, name, split):
    """Every rank's loops on one GPU; `split`: the row's zigzag, the documents layout (every
    document in 2N pieces: a query piece meets two key pieces in one block, merged) or
    contiguous shards (causal: schedules/contiguous.py; not causal: the row's split)."""
    from tests.thread_ring import run_ring
    from tokenring_xdit.ring.packed import Documents, doc_plan
    from tokenring_xdit.ring.schedules import block_schedule
    from tokenring_xdit.ring.split.sharding import shard_positions, zigzag_positions
    from tokenring_xdit.ring.tensor_layout import BSHD
    from tokenring_xdit.ring.training.backward import block_backward
    from tokenring_xdit.ring.training.forward import BlockCall, block_forward

    rng = random.Random(n * 2 + causal)
    dev, dtype, d, h, total = torch.device("cuda"), torch.bfloat16, 128, 4, 2 * n * 192
    cuts = sorted(rng.sample(range(1, total), 11))
    docs = Documents((0, *cuts, total))
    doc = torch.tensor([docs.doc_at(i) for i in range(total)], device=dev)
    mask = doc[:, None] == doc[None, :]
    if causal:
        mask &= torch.ones(total, total, dtype=torch.bool, device=dev).tril()
    gen = torch.Generator(device="cpu").manual_seed(n)
    q, k, v, do = (torch.randn(1, h, total, d, generator=gen).to(dev, dtype) for _ in "qkvo")
    ref = _ref(q, k, v, do, mask, d**-0.5)
    pair = _doc_pair(name, (dev, dtype, d, d))
    split = split if causal or split != "contiguous" else "zigzag"  # the same contiguous shards
    schedule = block_schedule(causal, split)
    q_lens = (total // n,) * n
    call = BlockCall(schedule, pair, BSHD, d**-0.5, doc_plan(docs, schedule, q_lens, split))

    def positions(r):
        if split in ("documents", "contiguous"):
            cut = {"causal": causal, "cu_seqlens": docs.bounds, "layout": split, "device": dev}
            return shard_positions(total, r, n, **cut)
        if causal and n > 1:
            return zigzag_positions(total, r, n, device=dev)
        return torch.arange(r * total // n, (r + 1) * total // n, device=dev)

    def rank_fn(ring):
        idx = positions(ring.rank)
        ql, kl, vl, dol = (
            x.index_select(2, idx).transpose(1, 2).contiguous() for x in (q, k, v, do)
        )
        out, lse = block_forward(call, ring, q_lens, ql, kl, vl)
        return [out, *block_backward(call, ring, q_lens, dol, ql, kl, vl, out, lse)]

    results = run_ring(n, rank_fn)
    order = torch.cat([positions(r) for r in range(n)])
    for i, want in enumerate((ref[0], *ref[2:])):
        got = torch.cat([res[i].transpose(1, 2).double() for res in results], dim=2)
        want = want.index_select(2, order)
        err = ((got - want).abs().max() / want.abs().max().clamp_min(1)).item()
        assert err <= TOL, (n, causal, name, i, err)


def test_ring_degree_1_api_with_cu_seqlens():
    from tokenring_xdit.ring import token_ring_attn_func

    total, d = 4096, 128
    cu = torch.tensor([0, 1, 700, 2048, 2049, 4096], dtype=torch.int32)
    gen = torch.Generator(device="cpu").manual_seed(2)
    q, do = (torch.randn(1, 8, total, d, generator=gen).cuda().bfloat16() for _ in "qo")
    k, v = (torch.randn(1, 2, total, d, generator=gen).cuda().bfloat16() for _ in "kv")
    doc = torch.repeat_interleave(torch.arange(5), cu.diff().long()).cuda()
    mask = (doc[:, None] == doc[None, :]) & torch.ones(total, total, dtype=torch.bool).cuda().tril()
    ref = _ref(q, k, v, do, mask, d**-0.5)
    loc = [x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v)]
    out = token_ring_attn_func(*loc, causal=True, cu_seqlens=cu)
    out.backward(do.transpose(1, 2))
    assert (out.transpose(1, 2).double() - ref[0]).abs().max() <= TOL
    for x, r in zip(loc, ref[2:], strict=True):
        err = (x.grad.transpose(1, 2).double() - r).abs().max() / r.abs().max().clamp_min(1)
        assert err <= TOL, float(err)


# --- the public API on a real NCCL ring, both layouts -------------------------------------------

API_DOCS = [0, 1, 2900, 2901, 3333, 4100, 4101, 6144]  # a long one, lengths 1, none divides 2N


def _blockwise(q, k, v, do, cu, n, layout, kernels=None):
    """The ring's own block decomposition of the call, run on this GPU without the ring: every
    segment of every (key rank, step) block that `doc_plan` schedules (enumerated by
    tests/packed_blocks.blocks) through SDPA's flash op (K/V expanded
    for GQA), bf16 outputs; out merged over the segments by lse in fp32; the backward fed the
    merged out and the global lse, dQ/dK/dV partials added per block in bf16 (the kernel
    wrappers' buffers), dK/dV folded over each GQA group in fp32, every block's partial summed
    in fp32 (the ring's accumulators from N = 3; at N = 2 its two-term bf16 add is the same
    single rounding). The error this gives is the decomposition's own: what the ring should
    match. Returns (out, dq, dk, dv), (1, h or hk, total, d) in q's dtype. `kernels`: another
    (forward, backward) pair of kernels.sdpa's signature (the CPU check of this function)."""
    from tests.packed_blocks import blocks
    from tokenring_xdit.ring.kernels.sdpa import flash_backward, flash_forward
    from tokenring_xdit.ring.tensor_layout import BHSD

    flash_forward, flash_backward = kernels or (flash_forward, flash_backward)
    (_, h, total, d), hk = q.shape, k.shape[1]
    g, scale, dev = h // hk, d**-0.5, q.device
    ke, ve = (x.repeat_interleave(g, dim=1) for x in (k, v))
    plan = [(b, sg, b.q_tile[sg.q0 : sg.q1].to(dev), b.k_tile[sg.k0 : sg.k1].to(dev))
            for b in blocks(tuple(cu), n, layout)[0] for sg in b.segs]  # fmt: skip
    out = torch.zeros(1, h, total, d, dtype=torch.float32, device=dev)
    lse = torch.full((1, h, total), float("-inf"), device=dev)
    for _, sg, qi, ki in plan:
        o, l_s = flash_forward(*(x[:, :, i] for x, i in ((q, qi), (ke, ki), (ve, ki))), scale,
                               BHSD, sg.causal)  # fmt: skip
        new = torch.logaddexp(lse[:, :, qi], l_s)
        out[:, :, qi] = out[:, :, qi] * (lse[:, :, qi] - new).exp().unsqueeze(-1) + o.float() * (
            l_s - new
        ).exp().unsqueeze(-1)
        lse[:, :, qi] = new
    out = out.to(q.dtype)
    sums = [torch.zeros(1, x, total, d, device=dev) for x in (h, hk, hk)]
    block, parts = None, None
    for b, sg, qi, ki in [*plan, (None, None, None, None)]:
        if b is not block and block is not None:  # a block's partials go home / into the sums
            dq, dk, dv = parts
            sums[0][:, :, block.q_tile.to(dev)] += dq.float()
            for acc, x in zip(sums[1:], (dk, dv), strict=True):
                acc[:, :, block.k_tile.to(dev)] += (
                    x.float().unflatten(1, (hk, g)).sum(2).to(q.dtype)
                )
        if b is None:
            break
        if b is not block:
            block = b
            parts = [torch.zeros(1, h, len(t), d, dtype=q.dtype, device=dev)
                     for t in (b.q_tile, b.k_tile, b.k_tile)]  # fmt: skip
        args = [x[:, :, i].contiguous() for x, i in ((do, qi), (q, qi), (ke, ki), (ve, ki))]
        grads = flash_backward(*args, out[:, :, qi].contiguous(), lse[:, :, qi].contiguous(), None,
                               scale, BHSD, sg.causal)  # fmt: skip
        for acc, x, lo, hi in zip(parts, grads, (sg.q0, sg.k0, sg.k0), (sg.q1, sg.k1, sg.k1),
                                  strict=True):  # fmt: skip
            acc[:, :, lo:hi] += x
    return out, *(x.to(q.dtype) for x in sums)


def _api_worker(rank, n):
    """token_ring_attn_func(causal=True, split=) on shards cut by shard(..., split=) for
    both layouts (bf16, GQA 8/2, d 128), the same block decomposition on this GPU alone
    (`_blockwise`), and each document alone through SDPA flash in bf16: max errors of out, dq,
    dk, dv vs fp64 on this rank's positions, relative to the reference's max magnitude there;
    per layout also the most partials a position of this rank sums (out/dq: queries; dk/dv:
    keys)."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tests.packed_blocks import blocks, max_partials
    from tokenring_xdit import make_split, shard, shard_positions, token_ring_attn_func
    from tokenring_xdit.ring import setup_token_ring_group

    setup_token_ring_group(dist.group.WORLD)
    cu, total, h, hk, d = API_DOCS, API_DOCS[-1], 8, 2, 128
    gen = torch.Generator(device="cpu").manual_seed(11)
    q, do = (torch.randn(1, h, total, d, generator=gen).cuda().bfloat16() for _ in "qo")
    k, v = (torch.randn(1, hk, total, d, generator=gen).cuda().bfloat16() for _ in "kv")
    doc = torch.repeat_interleave(torch.arange(len(cu) - 1), torch.tensor(cu).diff()).cuda()
    mask = (doc[:, None] == doc[None, :]) & torch.ones(total, total, dtype=torch.bool).cuda().tril()
    ref = [x for i, x in enumerate(_ref(q, k, v, do, mask, d**-0.5)) if i != 1]
    del mask

    def rel(got, want):  # (b, h, s, d) both
        return ((got.double() - want).abs().max() / want.abs().max()).item()

    # each document alone (the per-document ideal's own bf16 error)
    ins = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    outs = []
    for a, b in zip(cu, cu[1:], strict=False):
        kk, vv = (x[:, :, a:b].repeat_interleave(h // hk, dim=1) for x in ins[1:])
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            outs.append(F.scaled_dot_product_attention(ins[0][:, :, a:b], kk, vv, is_causal=True))
    out = torch.cat(outs, dim=2)
    out.backward(do)
    result = {"per_document": [rel(x, r) for x, r in zip((out, *(x.grad for x in ins)), ref,
                                                          strict=True)]}  # fmt: skip
    for layout in ("zigzag", "documents"):
        split = make_split(total, n, causal=True, cu_seqlens=cu, layout=layout)
        pos = shard_positions(split, rank, device="cuda")
        local = [shard(x.transpose(1, 2), split=split) for x in (q, k, v, do)]
        ins = [x.detach().contiguous().requires_grad_() for x in local[:3]]
        out = token_ring_attn_func(*ins, causal=True, split=split)
        out.backward(local[3])
        got = (out, *(x.grad for x in ins))
        result[layout] = [
            rel(x.transpose(1, 2), r[:, :, pos]) for x, r in zip(got, ref, strict=True)
        ]
        blockwise = _blockwise(q, k, v, do, cu, n, layout)
        result[layout + "_blockwise"] = [
            rel(x[:, :, pos], r[:, :, pos]) for x, r in zip(blockwise, ref, strict=True)
        ]
        bl, cpu_pos = blocks(tuple(cu), n, layout)
        length = len(cpu_pos[rank])
        result[layout + "_partials"] = [max_partials(bl, rank, length, side) for side in "qqkk"]
    torch.cuda.synchronize()
    return result


def test_public_api_on_a_real_ring_in_both_layouts():
    """Per layout and rank, out/dq/dk/dv vs fp64, relative to the reference's max magnitude:

    - the ring within 1.5x (+ 1e-3) of the same block decomposition run on one GPU without
      the ring (`_blockwise`: the partials the ring's schedule makes, bf16 each, summed in
      fp32), and that decomposition within TOL;
    - the ring within m x the per-document flash kernel's error (+ 1e-3), m (at least 1.5) the
      most bf16 partials a position of the rank sums (dQ and out: query side, dK/dV: key side).
      Why m: the per-document kernel rounds each gradient once; the ring rounds each of a
      position's m partials once (the kernel returns bf16) before its fp32 sum, each rounding
      at most half an ulp of the partial's size, which for these inputs is at most about the
      total's. A fixed 1.5x is no bound of that: the CPU emulation of these same roundings
      (benchmarks/diagnostics/packed_partials_rounding.py, exact partials)
      gives 2.0-2.2x the per-document error for dk on some ranks in both layouts, and on
      4 x H200 the zigzag's rank 1 measured 2.3x (7.65e-3 vs 3.34e-3).
    """
    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip("needs 2 or more GPUs")
    for rank, res in enumerate(values(run_ranks(_api_worker, n, backend="nccl", timeout=600))):
        print(f"rank {rank} of {n}: {res}")
        for layout in ("zigzag", "documents"):
            for i, name in enumerate(("out", "dq", "dk", "dv")):
                err, block = res[layout][i], res[layout + "_blockwise"][i]
                base, m = res["per_document"][i], max(1.5, res[layout + "_partials"][i])
                what = (rank, layout, name, err, block, base, m)
                assert err <= TOL and block <= TOL, what
                assert err <= 1.5 * block + 1e-3, what
                assert err <= m * base + 1e-3, what
