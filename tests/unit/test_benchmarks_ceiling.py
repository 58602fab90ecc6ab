"""benchmarks/ceiling.py: the blocks it times per rank are the kernel calls the ring makes (the
real forward/backward loops of one rank, with local lanes, record every call), and the probe
runs at a tiny size on the CPU for every mask and pass."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from benchmarks.ceiling import (  # noqa: E402
    BlockRun,
    ceiling,
    documents_of,
    main,
    rank_blocks,
)
from tests.local_ring import LocalRing  # noqa: E402
from tokenring_xdit.ring.training.backward import block_backward
from tokenring_xdit.ring.training.forward import BlockCall, block_forward
from tokenring_xdit.ring.packed import doc_plan
from tokenring_xdit.ring.inference.loop import RingCall, local_forward, ring_forward
from tokenring_xdit.ring.kernels import MASKED, MATH  # noqa: E402
from tokenring_xdit.ring.tensor_layout import BSHD
from tokenring_xdit.ring.schedules import CAUSAL_ZIGZAG, NON_CAUSAL, NON_CAUSAL_BLOCKS  # noqa: E402

H, D = 2, 8
CU = (0, 5, 6, 19, 40, 48)  # packed documents of 48 tokens (some cross shards, one is tiny)


class _Recorder:
    """Wraps a kernel's forward/backward and records (q_len, kv_len, mask, own) per call."""

    def __init__(self, fn, calls: list, backward: bool = False):
        self.fn, self.calls, self.backward = fn, calls, backward

    def __call__(self, *args):
        if self.backward:
            _, q, k, _, out, *_, mask = args
            self.calls.append(("bwd", q.shape[1], k.shape[1], mask, out is not None))
        else:
            q, k = args[0], args[1]
            mask = args[5] if len(args) > 5 else False
            self.calls.append(("fwd", q.shape[1], k.shape[1], mask))
        return self.fn(*args)


def _recording(record, calls):
    return dataclasses.replace(
        record,
        forward=_Recorder(record.forward, calls),
        backward=_Recorder(record.backward, calls, backward=True),
    )


def _tensors(t: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, t, H, D, generator=gen, dtype=torch.float64) for _ in range(4)]


def _ring_calls(n: int, rank: int, t: int, causal: bool, train: bool, docs) -> list:
    """The kernel calls rank `rank` of a ring of n makes, from the ring's own loops."""
    calls: list = []
    q, k, v, do = _tensors(t, rank)
    ring, q_lens = LocalRing(rank, n), (t,) * n
    if not (causal or train or docs is not None):  # the inference forward

        def block(qb, kb, vb, scale, layout):
            calls.append(("fwd", qb.shape[1], kb.shape[1], False))
            return MATH.block(qb, kb, vb, scale, layout)

        call = RingCall(NON_CAUSAL, block, None, BSHD, D**-0.5, 1, "rear", False, None)
        if n == 1:
            local_forward(call, q, k, v, None)
        else:
            ring_forward(call, ring, q_lens, q, k, v, None)
        return calls
    schedule = CAUSAL_ZIGZAG if causal else NON_CAUSAL_BLOCKS
    plan = doc_plan(docs, schedule, q_lens) if docs is not None else None
    pair = _recording(MASKED if docs is not None else MATH, calls)
    call = BlockCall(schedule, pair, BSHD, D**-0.5, plan)
    out, lse = block_forward(call, ring, q_lens, q, k, v)
    if train:
        block_backward(call, ring, q_lens, do, q, k, v, out, lse)
    return calls


def _expected(blocks: list[BlockRun], train: bool, n: int) -> list:
    fwd = [("fwd", b.q_len, b.kv_len, b.mask) for b in blocks]
    if not train:
        return fwd
    return fwd + [("bwd", b.q_len, b.kv_len, b.mask, n == 1 or b.own) for b in blocks]


# packed documents at n = 2 and 4 (48 tokens make no zigzag shards of 3)
CASES = [
    (n, mask)
    for n in (1, 2, 3, 4)
    for mask in ("full", "causal", "packed", "packed-full")
    if n != 3 or not mask.startswith("packed")
]


@pytest.mark.parametrize("n,mask", CASES)
@pytest.mark.parametrize("train", [False, True])
def test_the_probes_blocks_are_the_rings_kernel_calls(n, mask, train):
    t = 48 // n if n != 3 else 12
    causal = mask in ("causal", "packed")
    docs = documents_of("cu:" + ",".join(map(str, CU)), 48) if mask.startswith("packed") else None
    for rank in range(n):
        blocks = rank_blocks(n, rank, t, causal=causal, train=train, docs=docs)
        got = _ring_calls(n, rank, t, causal, train, docs)
        assert got == _expected(blocks, train, n), (n, rank, mask, train)
        assert blocks, "every rank here has work"


def test_the_inference_forward_holds_back_and_pieces_like_the_ring():
    # 4096 local queries: the auto rule holds a quarter of the own block back; 3 final pieces
    blocks = rank_blocks(2, 0, 4096, causal=False, train=False, final_chunks=3)
    assert [(b.step, b.q_len) for b in blocks] == [(0, 3072), (1, 1366), (1, 1365), (1, 1365),
                                                   (0, 1024)]  # fmt: skip
    assert [b.q_len for b in rank_blocks(2, 0, 4096, causal=False, train=True)] == [4096, 4096]


def test_documents_of_lengths_and_cu_seqlens():
    docs = documents_of("exp:100", 1000, seed=3)
    assert docs.total == 1000 and docs.count > 3
    assert documents_of("exp:100", 1000, seed=3) == docs  # seeded: the same on every run
    assert documents_of("fixed:300", 1000).bounds == (0, 300, 600, 900, 1000)
    assert documents_of("cu:0,10,64", 64).bounds == (0, 10, 64)
    with pytest.raises(ValueError, match="exp:MEAN"):
        documents_of("zipf:3", 64)


@pytest.mark.parametrize("mask", ["full", "causal", "packed"])
@pytest.mark.parametrize("train", [False, True])
def test_ceiling_runs_on_the_cpu(mask, train):
    docs = documents_of("cu:" + ",".join(map(str, CU)), 48) if mask == "packed" else None
    whole = None
    for n in (2, 4):
        row = ceiling(
            48, 4, 16, n, kv_heads=2, causal=mask != "full", docs=docs, train=train,
            dtype=torch.float32, device="cpu", kernel="math", iters=1, warmup=1,
            budget_ms=1.0, whole_ms=whole,
        )  # fmt: skip
        whole = row["whole_ms"]
        assert row["ring"] == n and len(row["rank_ms"]) == n and row["kv_heads"] == 2
        assert row["mask"] == mask and row["pass"] == ("fwd+bwd" if train else "fwd")
        assert row["busiest_ms"] == max(row["rank_ms"]) > 0
        assert math.isclose(row["ceiling"], whole / n / row["busiest_ms"])


def test_the_cli_writes_json(tmp_path):
    out = tmp_path / "c.json"
    argv = ["--tokens", "32", "--rings", "2", "--heads", "2", "--kv-heads", "2",
            "--head-dim", "8", "--dtype", "float32", "--device", "cpu", "--iters", "1",
            "--masks", "causal,packed", "--passes", "fwd+bwd", "--docs", "fixed:12", "--out",
            str(out)]  # fmt: skip
    assert main(argv) == 0
    import json

    data = json.loads(out.read_text())
    assert [(r["mask"], r["pass"], r["ring"]) for r in data["rows"]] == [
        ("causal", "fwd+bwd", 2), ("packed", "fwd+bwd", 2)
    ]  # fmt: skip
    assert data["meta"]["command"].startswith("python -m benchmarks ceiling --tokens 32")
    assert main([*argv, "--time-limit", "1e-9"]) == 0  # stops before the first shape
    data = json.loads(out.read_text())
    assert data["rows"] == [] and "--time-limit" in data["meta"]["stopped"]


def test_ring_1_times_only_the_whole_sequence():
    row = ceiling(32, 2, 8, 1, causal=True, train=True, dtype=torch.float32, device="cpu",
                  kernel="math", iters=1, budget_ms=1.0)  # fmt: skip
    assert row["rank_ms"] == [row["whole_ms"]] and row["ceiling"] == 1.0


def test_the_sweeps_print_efficiency_and_the_share_of_the_ceiling():
    import ring_sweep
    import train_sweep

    row = {"model": "flux", "tokens": 4608, "token_ring_efficiency": 0.6}
    row.update(ulysses_efficiency=0.7, torch_ag_efficiency=None)
    row.update(ceiling=0.8, token_ring_of_ceiling=0.75)
    line = ring_sweep.efficiency_line(row)
    assert "token_ring 0.600, ulysses 0.700" in line and "0.750 of its kernel ceiling 0.800" in line
    rows = []
    for impl, ms in (("token_ring", 5.0), ("ulysses", 4.0), ("yunchang_basic", None)):
        r = dict(impl=impl, ms=ms) if ms else dict(impl=impl, error="x")
        train_sweep._add_efficiency(r, impl, {"one_gpu_ms": 16.0, "ceiling": 0.9}, 4)
        rows.append(dict(shape="s", seq=16384, causal=True, **r))
    assert rows[0]["efficiency"] == pytest.approx(0.8) and rows[1]["efficiency"] == 1.0
    assert rows[0]["of_ceiling"] == pytest.approx(0.8 / 0.9) and "ceiling" not in rows[1]
    assert "efficiency" not in rows[2]
    line = train_sweep._efficiency_line(rows)
    assert "token_ring 0.800, ulysses 1.000" in line and "0.889 of its kernel ceiling 0.900" in line


# --- sliding windows -------------------------------------------------------------------------

WINDOW_CASES = [
    (n, split, left)
    for n in (2, 3, 4)
    for split in ("zigzag", "contiguous")
    for left in (3, 12, 40)  # inside a chunk, across a shard, wider than two shards
]


def _window_ring_calls(n: int, rank: int, t: int, window, split: str, train: bool) -> list:
    """The kernel calls rank `rank` makes in a windowed call, from the ring's own loops and
    the window plan the call's preparation builds."""
    from tokenring_xdit.ring.kernels.window import banded
    from tokenring_xdit.ring.packed.window_plan import window_plan
    from tokenring_xdit.ring.schedules.window import Window

    calls: list = []
    q, k, v, do = _tensors(t, rank)
    plan = window_plan(Window.of(window, True), True, (t,) * n, split)
    call = BlockCall(plan.schedule, _recording(banded(MATH, MASKED), calls), BSHD, D**-0.5, plan)
    out, lse = block_forward(call, LocalRing(rank, n), (t,) * n, q, k, v)
    if train:
        block_backward(call, LocalRing(rank, n), (t,) * n, do, q, k, v, out, lse)
    return calls


@pytest.mark.parametrize("n,split,left", WINDOW_CASES)
@pytest.mark.parametrize("train", [False, True])
def test_the_window_probes_blocks_are_the_rings_kernel_calls(n, split, left, train):
    t = 16
    for rank in range(n):
        blocks = rank_blocks(n, rank, t, causal=True, train=train, window=(left, 0), split=split)
        got = _window_ring_calls(n, rank, t, (left, 0), split, train)
        assert got == _expected(blocks, train, n), (n, rank, split, left, train)


def test_the_window_blocks_are_the_window_plans():
    # ring 4, contiguous shards of 16, W = 41: rank 0's own block stays a causal flag, the
    # queries of shard 1 see all its keys (a plain flag), those of shards 2 and 3 a band
    from tokenring_xdit.ring.packed.window_plan import window_plan
    from tokenring_xdit.ring.schedules.window import Window

    plan = window_plan(Window(40, 0), True, (16,) * 4, "contiguous")
    for rank in range(4):
        blocks = rank_blocks(4, rank, 16, causal=True, train=True, window=(40, 0),
                             split="contiguous")  # fmt: skip
        kept = [(st.step, plan.block(rank, st.step)) for st in plan.steps[rank]
                if st.kernel and plan.block(rank, st.step) != ()]  # fmt: skip
        assert [(b.step, b.mask) for b in blocks] == kept
    masks = [b.mask for b in rank_blocks(4, 0, 16, causal=True, train=False, window=(40, 0),
                                         split="contiguous")]  # fmt: skip
    assert masks[:2] == [True, False]
    assert len(masks) == 4 and all(s.band is not None for m in masks[2:] for s in m)
    # W = 9: shard 3's queries are out of reach of rank 0's keys, the ring skips that block
    assert len(rank_blocks(4, 0, 16, causal=True, train=False, window=(8, 0),
                           split="contiguous")) == 2  # fmt: skip
    with pytest.raises(ValueError, match="windowed call"):
        rank_blocks(4, 0, 16, causal=True, train=False, split="contiguous")


@pytest.mark.parametrize("split", ["zigzag", "contiguous"])
@pytest.mark.parametrize("train", [False, True])
def test_the_window_ceiling_counts_each_kernels_calls(split, train):
    # the busiest rank's calls by kernel: causal flags on the call's kernel (math), the
    # window's segments on the band kernel (the exact masked one on the CPU); which rank is
    # busiest is the CPU's timing, the counts hold for any
    row = ceiling(
        64, 4, 16, 4, kv_heads=2, causal=True, train=train, dtype=torch.float32, device="cpu",
        kernel="math", iters=1, budget_ms=1.0, window_size=(40, 0), split=split,
    )  # fmt: skip
    blocks = rank_blocks(4, row["busiest_rank"], 16, causal=True, train=train, window=(40, 0),
                         split=split)  # fmt: skip
    flags = sum(isinstance(b.mask, bool) for b in blocks)
    want = {"math": flags, "masked": len(blocks) - flags}
    got = {name: k["calls"] for name, k in row["kernels"].items()}
    assert got == {name: c for name, c in want.items() if c}
    assert row["blocks"] == len(blocks) and row["window"] == 41 and row["split"] == split
    banded = sum(s.band is not None for b in blocks if not isinstance(b.mask, bool) for s in b.mask)
    assert sum(k["banded"] for k in row["kernels"].values()) == banded
    assert row["kernel"] == "math+window:masked" and row["ceiling"] > 0


def test_the_cli_writes_window_rows_and_band_shapes(tmp_path):
    out = tmp_path / "w.json"
    argv = ["--windows", "8", "--tokens", "64", "--rings", "2,4", "--heads", "2", "--kv-heads",
            "1", "--head-dim", "8", "--dtype", "float32", "--device", "cpu", "--kernel", "math",
            "--iters", "1", "--budget-ms", "1", "--passes", "fwd+bwd", "--whole-kernels",
            "masked,flash_varlen", "--band-kernels", "masked", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    import json

    data = json.loads(out.read_text())
    rows = data["rows"]
    assert [(r["split"], r["ring"]) for r in rows] == [
        ("zigzag", 2), ("zigzag", 4), ("contiguous", 2), ("contiguous", 4)
    ]  # fmt: skip
    for r in rows:
        whole = r["whole_kernels_ms"]
        assert whole["flash_varlen"].startswith("skipped") and r["whole_kernel"] == "masked"
        assert r["whole_ms"] == whole["masked"] and r["window_size"] == [7, 0]
        segs = r["band_segments"]
        shapes = {(b["n_q"], b["n_k"], *b["band"]) for b in data["bands"]}
        assert segs and all(tuple(s[:4]) in shapes for s in segs)
        assert r["band_kernels_ms"]["masked"] > 0
    assert {b["pass"] for b in data["bands"]} == {"fwd+bwd"}
    # a shape met by two rows is timed once
    assert len(data["bands"]) == len({(b["n_q"], b["n_k"], *b["band"]) for b in data["bands"]})


def test_flex_block_mask_from_the_band_is_create_block_masks():
    from _window_kernels import Rect, band_block_mask
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from tokenring_xdit.ring.kernels.wrappers import expanded

    for n_q, n_k, (lo, hi) in [(300, 300, (0, 37)), (257, 257, (-100, 0)),
                               (129, 400, (-200, 50)), (200, 130, (None, 5))]:  # fmt: skip

        def visible(b, h, q, k, lo=lo, hi=hi):
            d = q - k
            keep = d == d
            keep = keep & (d >= lo) if lo is not None else keep
            return keep & (d <= hi) if hi is not None else keep

        ours = band_block_mask(n_q, n_k, (lo, hi), "cpu", block=32)
        ref = create_block_mask(visible, None, None, n_q, n_k, device="cpu", BLOCK_SIZE=32)
        assert torch.equal(ours.to_dense(), ref.to_dense())
        assert torch.equal(ours.full_kv_num_blocks, ref.full_kv_num_blocks)
        rect = Rect(n_q, n_k, (lo, hi), 4, 2, 16, False, torch.float32, "cpu")
        qb, kb, vb = (x.transpose(1, 2) for x in (rect.q, rect.k, rect.v))
        got = flex_attention(qb, kb, vb, block_mask=band_block_mask(n_q, n_k, (lo, hi), "cpu"),
                             scale=rect.scale, enable_gqa=True)  # fmt: skip
        want, _ = expanded(MASKED).forward(rect.q, rect.k, rect.v, rect.scale, BSHD, rect.mask)
        torch.testing.assert_close(got.transpose(1, 2), want, atol=1e-5, rtol=1e-5)
