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
