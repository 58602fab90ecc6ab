"""Packed documents under torch.compile with Inductor on ONE GPU, ranks through IPC (marker `gpu`):

python3 -m pytest -m gpu -q tests/gpu/test_gpu_compile_packed.py

Ranks are processes with a gloo world group and CUDA tensors on cuda:0
(TOKENRING_XDIT_TRANSPORT=ipc), as in test_gpu_compile.py. Every case is causal and packed:
documents as cu_seqlens (a list, an int32 tensor, or with the split) and as position ids that
restart, shards cut in the row's zigzag and in the documents layout (the call gets the split the
shards were cut by); training in fp32 (out, lse, dq, dk, dv) and inference in bf16 (out,
lse). The compiled function scales q by 2 before the ring (and the softmax scale by 1/2, exact
in both dtypes), so Inductor emits kernels around the ring and feeds it its own buffers.
- torch.compile(fullgraph=True) and torch.compile() (the default: graph breaks allowed), both
  the default Inductor backend: compiled vs eager, the ring vs float64 exact attention of each
  document alone (tests/reference.py), graph breaks 0 and one compiled graph per case over two
  calls. Ring 2: every case; ring 3 (documents uneven against every split): fullgraph training.
- a tiny GQA Llama (transformers, attn_implementation="token_ring") trained 3 SGD steps on
  packed batches cut by shard_batch (position_ids= in both layouts, then cu_seqlens=),
  compiled fullgraph with Inductor vs eager: every loss and gradient equal within tolerance,
  no graph break.

The same workers run on CPU (gloo, backend aot_eager or inductor) by hand, outside the CPU
suite, to exercise the logic without a GPU:

PYTHONPATH=$PWD python3 -m tests.gpu.test_gpu_compile_packed --device cpu --backend aot_eager
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import traceback

import pytest
import torch

from tests.harness import run_ranks, tiny_llama_config, values
from tests.reference import exact_attention, exact_grads
from tokenring_xdit import make_split, shard, shard_positions, token_ring_attn

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

FP32_TOL = 2e-5  # vs eager, and vs exact relative to max(1, |exact|) (test_gpu_compile.py)
BF16_TOL = 3e-2  # compiled vs eager in bf16 (test_gpu_compile.py's bound)
BF16_EXACT_TOL = 4e-2  # bf16 ring vs fp64 exact, relative to max(1, |exact|) (test_gpu_packed.py)
BF16_LSE_TOL = 1e-2  # bf16 lse vs exact, absolute (test_gpu_packed.py)
LLAMA_LOSS_TOL = 1e-5  # Inductor's fused reductions round differently from eager's
LLAMA_GRAD_REL_TOL = 1e-4
H, HK, D = 4, 2, 64  # query heads, K/V heads (GQA), head size
DOCS = [0, 1, 37, 38, 61, 96]  # lengths 1, 36, 1, 23, 35: across chunk and shard bounds
SCALE = D**-0.5
# name: (documents as: beside the split as a list, a tensor, or position ids; or with it)
PACKINGS = {
    "cu-list-zigzag": ("list", "zigzag"),
    "cu-list-documents": ("list", "documents"),
    "cu-tensor-zigzag": ("tensor", "zigzag"),
    "cu-with-split-documents": ("split", "documents"),
    "positions-zigzag": ("positions", "zigzag"),
}
# (packing, train, fullgraph) per ring size: fullgraph everything on ring 2, the default mode on
# one case per documents form and dtype; ring 3 (uneven) the fullgraph training cases
CASES = {
    2: [(p, train, True) for p in PACKINGS for train in (True, False)]
    + [("positions-zigzag", True, False), ("cu-with-split-documents", True, False),
       ("cu-list-zigzag", False, False)],
    3: [(p, True, True) for p in PACKINGS],
}  # fmt: skip
LLAMA_SEQ = 24  # divides by 2N for N = 2
LLAMA_STEPS = (  # (document lengths, how shard_batch gets them, layout); 5 documents each
    ((5, 1, 9, 3, 6), "position_ids", "zigzag"),
    ((1, 13, 1, 1, 8), "position_ids", "documents"),
    ((7, 7, 2, 4, 4), "cu_seqlens", "auto"),
)


def _compile(fn, backend: str, fullgraph: bool):
    """torch.compile as a user writes it: Inductor is the default backend, not named."""
    kwargs = {} if backend == "inductor" else {"backend": backend}
    return torch.compile(fn, fullgraph=fullgraph, **kwargs)


def _counts() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values()), counters["stats"]["unique_graphs"]


def _ring_fn(q, k, v, **packed):
    """q doubled, the scale halved: the same attention, with an Inductor kernel before it."""
    return token_ring_attn(q * 2.0, k, v, causal=True, softmax_scale=SCALE / 2, **packed)


def _exact(full: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """fp64 attention of each document alone (causal), concatenated: out/dq/dk/dv (1, T, h, D),
    lse (1, H, T)."""
    parts: dict[str, list] = {name: [] for name in ("out", "lse", "dq", "dk", "dv")}
    for a, b in zip(DOCS, DOCS[1:], strict=False):
        q, k, v, do = (x[:, a:b].double() for x in full)
        for name, x in zip(
            ("out", "dq", "dk", "dv"),
            exact_grads(q, k, v, do, causal=True, scale=SCALE),
            strict=True,
        ):
            parts[name].append(x)
        parts["lse"].append(exact_attention(q, k, v, causal=True, scale=SCALE)[1])
    return {name: torch.cat(xs, dim=2 if name == "lse" else 1) for name, xs in parts.items()}


def _run(fn, qkv, do, packed, train) -> dict[str, torch.Tensor]:
    xs = [x.detach().clone().requires_grad_(train) for x in qkv]
    if not train:
        with torch.no_grad():
            out, lse = fn(*xs, **packed)
        return {"out": out, "lse": lse}
    out, lse = fn(*xs, **packed)
    out.backward(do)
    grads = dict(zip(("dq", "dk", "dv"), (x.grad for x in xs), strict=True))
    return {"out": out.detach(), "lse": lse.detach(), **grads}


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double().cpu() - want).abs().max() / want.abs().max().clamp_min(1))


def _case(rank, n, dev, backend, packing, train, fullgraph) -> dict:
    """One packed case: eager and compiled (twice), errors vs each other and vs exact."""
    start = time.perf_counter()
    torch._dynamo.reset()  # a fresh compile per case (one code object serves every case)
    form, layout = PACKINGS[packing]
    dtype = torch.float32 if train else torch.bfloat16
    gen = torch.Generator().manual_seed(list(PACKINGS).index(packing) + 10 * train)
    full = [torch.randn(1, DOCS[-1], h, D, generator=gen).to(dtype) for h in (H, HK, HK, H)]
    ref = _exact(full)  # of the rounded inputs
    cut = {"cu_seqlens": DOCS, "layout": layout} if form != "positions" else {}
    split = make_split(DOCS[-1], n, causal=True, **cut)  # the calls get it: split=
    q, k, v, do = (shard(x, split=split).to(dev) for x in full)
    pos = shard_positions(split, rank)
    bare = dataclasses.replace(split, docs=None)
    if form == "positions":
        restart = torch.cat([torch.arange(b - a) for a, b in zip(DOCS, DOCS[1:], strict=False)])
        packed = {"split": bare, "position_ids": shard(restart[None], split=split, dim=-1).to(dev)}
    elif form == "split":
        packed = {"split": split}
    else:
        cu = list(DOCS) if form == "list" else torch.tensor(DOCS, dtype=torch.int32)
        packed = {"split": bare, "cu_seqlens": cu}
    breaks, graphs = _counts()
    compiled_fn = _compile(_ring_fn, backend, fullgraph)
    runs = [_run(compiled_fn, (q, k, v), do, packed, train) for _ in range(2)]
    breaks, graphs = _counts()[0] - breaks, _counts()[1] - graphs
    eager = _run(_ring_fn, (q, k, v), do, packed, train)
    vs_eager = max(float((run[x].float() - eager[x].float()).abs().max()) for run in runs
                   for x in eager)  # fmt: skip
    vs_exact = {}
    for name, got in runs[-1].items():
        want = ref[name].index_select(2 if name == "lse" else 1, pos)
        vs_exact[name] = _rel(got, want)
    return {
        "vs_eager": vs_eager,
        "vs_exact": vs_exact,
        "graph_breaks": breaks,
        "graphs": graphs,
        "s": round(time.perf_counter() - start, 1),
    }


def _llama(dev, backend) -> dict:
    """The tiny Llama trained LLAMA_STEPS eagerly and compiled fullgraph: losses, gradients."""
    from transformers import AutoModelForCausalLM

    from tokenring_xdit.integrations import transformers as tr_hf

    start = time.perf_counter()
    torch._dynamo.reset()
    tr_hf.register()
    cfg = tiny_llama_config(use_cache=False)
    gen = torch.Generator().manual_seed(9)
    batches = []
    for lengths, given, layout in LLAMA_STEPS:
        ids = torch.randint(0, 64, (1, LLAMA_SEQ), generator=gen).to(dev)
        if given == "position_ids":
            docs = {"position_ids": torch.cat([torch.arange(x) for x in lengths])[None].to(dev)}
        else:
            docs = {"cu_seqlens": torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()],
                                               dtype=torch.int32)}  # fmt: skip
        batches.append((ids, docs, layout))
    runs, breaks = [], 0
    for compiled in (False, True):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=tr_hf.NAME).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        before = _counts()[0]
        run = _compile(model, backend, fullgraph=True) if compiled else model
        losses, grads = [], []
        for ids, docs, layout in batches:
            batch = tr_hf.shard_batch(ids, layout=layout, **docs)
            labels = batch.pop("shift_labels")
            loss = tr_hf.ring_loss(run(**batch).logits, labels)
            opt.zero_grad()
            loss.backward()
            tr_hf.sync_gradients(model)
            losses.append(loss.item())
            grads.append({k: p.grad.double().cpu() for k, p in model.named_parameters()})
            opt.step()
        breaks += _counts()[0] - before
        runs.append((losses, grads))
    (la, ga), (lb, gb) = runs
    grad = max(float((b[k] - a[k]).abs().max() / a[k].abs().max().clamp_min(1e-6))
               for a, b in zip(ga, gb, strict=True) for k in a)  # fmt: skip
    return {
        "loss": max(abs(x - y) for x, y in zip(la, lb, strict=True)),
        "grad_rel": grad,
        "losses": la,
        "params": len(ga[0]),
        "graph_breaks": breaks,
        "s": round(time.perf_counter() - start, 1),
    }


def _guarded(name, fn, *args) -> dict:
    """fn(*args), or the error it raised (printed at once: a later hang still shows it). A
    compile error is the same on every rank, so the other cases still run and report."""
    try:
        return fn(*args)
    except Exception as exc:
        trace = traceback.format_exc()
        print(f"{name}: {trace}", file=sys.stderr, flush=True)
        return {"error": f"{type(exc).__name__}: {exc}"[:1500], "trace": trace[-3000:]}


def _worker(rank, n, device, backend, llama):
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(0)
    res = {}
    for packing, train, fullgraph in CASES[n]:
        name = (
            f"{packing}/{'train' if train else 'infer'}/{'fullgraph' if fullgraph else 'default'}"
        )
        res[name] = _guarded(name, _case, rank, n, dev, backend, packing, train, fullgraph)
    if llama:
        res["llama"] = _guarded("llama", _llama, dev, backend)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return res


def _launch_on(n, device, backend, llama, timeout=560):
    env = {"TOKENRING_XDIT_TRANSPORT": "ipc"} if device == "cuda" else {}
    return values(run_ranks(_worker, n, device, backend, llama, timeout=timeout, env=env))


def check_cases(results: list[dict]) -> None:
    """Every rank's ring cases: no graph break, one graph, compiled = eager, ring = exact."""
    bad = []
    for rank, res in enumerate(results):
        for name, case in res.items():
            if name == "llama":
                continue
            print(f"rank {rank} {name}: {case}")
            if "error" in case:
                bad.append((rank, name, case["error"]))
                continue
            bf16 = "/infer/" in name
            exact_ok = all(
                err <= (BF16_LSE_TOL if x == "lse" else BF16_EXACT_TOL) if bf16 else err <= FP32_TOL
                for x, err in case["vs_exact"].items()
            )
            want_keys = {"out", "lse"} if bf16 else {"out", "lse", "dq", "dk", "dv"}
            if (case["graph_breaks"] != 0 or case["graphs"] != 1
                    or case["vs_eager"] > (BF16_TOL if bf16 else FP32_TOL) or not exact_ok
                    or set(case["vs_exact"]) != want_keys):  # fmt: skip
                bad.append((rank, name, case))
    assert not bad, bad


def check_llama(results: list[dict]) -> None:
    for rank, res in enumerate(results):
        got = res["llama"]
        print(f"rank {rank} llama: {got}")
        assert "error" not in got, got["trace"]
        assert got["graph_breaks"] == 0, got
        assert got["params"] > 10, got
        assert len(set(got["losses"])) == len(LLAMA_STEPS), got  # the steps do train
        assert got["loss"] <= LLAMA_LOSS_TOL and got["grad_rel"] <= LLAMA_GRAD_REL_TOL, got


_LAUNCHES: dict[int, list[dict] | Exception] = {}


def _launch(n):
    """Ring n's results (ring 2 with the Llama), launched once for the tests that read them:
    a failed launch is kept too, so the second test does not pay for it again."""
    if n not in _LAUNCHES:
        try:
            _LAUNCHES[n] = _launch_on(n, "cuda", "inductor", llama=n == 2)
        except Exception as exc:
            _LAUNCHES[n] = exc
    got = _LAUNCHES[n]
    if isinstance(got, Exception):
        raise got
    return got


@pytest.mark.parametrize("n", [2, 3])
def test_packed_documents_compiled_with_inductor_match_eager_and_exact(n):
    check_cases(_launch(n))


def test_packed_llama_compiled_with_inductor_trains_like_eager():
    check_llama(_launch(2))


def main() -> None:
    """By hand, e.g. on CPU: --device cpu --backend aot_eager (the GPU test's checks)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--backend", default="aot_eager")
    parser.add_argument("--n", type=int, default=2, choices=sorted(CASES))
    parser.add_argument("--no-llama", action="store_true")
    args = parser.parse_args()
    start = time.perf_counter()
    llama = not args.no_llama
    results = _launch_on(args.n, args.device, args.backend, llama, timeout=1800)
    check_cases(results)
    if llama:
        check_llama(results)
    print(f"passed: ring {args.n}, {args.device}, {args.backend}, "
          f"{time.perf_counter() - start:.0f} s")  # fmt: skip


if __name__ == "__main__":
    # run as the importable module, so the spawned ranks find _worker by name
    from tests.gpu import test_gpu_compile_packed

    test_gpu_compile_packed.main()
