"""TokenRing under torch.compile on ONE GPU, ranks through the IPC transport (marker `gpu`):

python -m pytest -m gpu tests/gpu/test_gpu_compile.py -q -s -rA

Ranks are processes with a gloo world group and CUDA tensors on cuda:0
(TOKENRING_XDIT_TRANSPORT=ipc), as in test_gpu_ipc_ring.py. One launch per ring size:
- a tiny transformer block (Linear -> token_ring_attn_func -> Linear), compiled fullgraph with
  Inductor: inference (bf16 and fp32, non-causal) and training (fp32, causal zigzag and
  non-causal): compiled vs eager, and the ring vs float64 exact attention;
- mode="reduce-overhead" (cudagraph trees): either it runs and matches eager (the ring op is
  tagged cudagraph_unsafe, Inductor keeps CUDA graphs around it), or it is refused with
  TokenRing's one RuntimeError; never a hang (the launcher's deadline fails the test);
- graph breaks 0, one compiled frame per function; the step time of the compiled block vs eager
  is printed (not asserted).
"""

from __future__ import annotations

import functools
import time

import pytest
import torch

from tests.harness import run_ranks, values

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

FP32_TOL = 2e-5
BF16_TOL = 3e-2  # compiled vs eager in bf16: Inductor fuses the Linears differently
H, D, S = 4, 64, 128  # heads, head size, local length (a zigzag shard: two halves of 64)


class Block(torch.nn.Module):
    def __init__(self, causal: bool, split=None):
        super().__init__()
        self.causal, self.split = causal, split  # the split its input's shards were cut by
        self.qkv = torch.nn.Linear(H * D, 3 * H * D)
        self.proj = torch.nn.Linear(H * D, H * D)

    def forward(self, x):
        import tokenring_xdit as tr

        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, H, D).unbind(2)
        out = tr.token_ring_attn_func(q, k, v, causal=self.causal, split=self.split)
        return self.proj(out.reshape(b, s, H * D))


def _split(n, causal):
    from tokenring_xdit import make_split

    return make_split(S * n, n, causal=causal)


def _block(n, causal, dtype):
    torch.manual_seed(0)  # the same weights on every rank
    return Block(causal, _split(n, causal)).to("cuda", dtype)


def _input(rank, n, dtype, causal):
    from tokenring_xdit import shard

    full = torch.randn(1, S * n, H * D, generator=torch.Generator().manual_seed(7))
    return shard(full, split=_split(n, causal)).to("cuda", dtype)


def _step(model, x, train):
    if not train:
        with torch.no_grad():
            return model(x), None
    out = model(x)
    out.square().mean().backward()
    # a compiled module names its parameters "_orig_mod.<name>"
    grads = {k.removeprefix("_orig_mod."): p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    return out.detach(), grads


def _time(fn, reps=10):
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps * 1e3


def _case(rank, n, dtype, causal, train, mode="default"):
    from torch._dynamo.testing import CompileCounterWithBackend

    model, x = _block(n, causal, dtype), _input(rank, n, dtype, causal)
    eager, eager_grads = _step(model, x, train)
    torch._dynamo.utils.counters.clear()
    if mode == "default":
        cnt = CompileCounterWithBackend("inductor")
        compiled = torch.compile(model, fullgraph=True, backend=cnt)
    else:  # a mode is Inductor's option: a custom counting backend would silently drop it
        cnt = None
        compiled = torch.compile(model, fullgraph=True, mode=mode)
    try:
        got, grads = _step(compiled, x, train)
        got, grads = _step(compiled, x, train)  # reduce-overhead records on a later call
    except RuntimeError as exc:
        return {"refused": str(exc)[:400]}
    err = float((got.float() - eager.float()).abs().max())
    if train:
        err = max([err] + [float((grads[k] - eager_grads[k]).abs().max()) for k in grads])
    return {
        "vs_eager": err,
        "frames": cnt.frame_count
        if cnt
        else torch._dynamo.utils.counters["stats"]["unique_graphs"],
        "eager_ms": _time(lambda: _step(model, x, train)),
        "compiled_ms": _time(lambda: _step(compiled, x, train)),
    }


def _ring_exact(rank, n):
    """The ring alone, compiled: vs float64 exact attention over the whole sequence."""
    import tokenring_xdit as tr

    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, S * n, H, D, generator=gen, dtype=torch.float64) for _ in "qkv")
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(x.transpose(1, 2) for x in (q, k, v))
    ).transpose(1, 2)[:, rank * S : (rank + 1) * S]
    mine = [x[:, rank * S : (rank + 1) * S].to("cuda", torch.float32) for x in (q, k, v)]
    with torch.no_grad():
        out = torch.compile(tr.token_ring_attn_func, fullgraph=True)(*mine)
    return float((out.double().cpu() - ref).abs().max())


def _worker(rank, n):
    from torch._dynamo.utils import counters

    torch.cuda.set_device(0)
    res = {"ring_vs_exact": _ring_exact(rank, n)}
    res["infer_bf16"] = _case(rank, n, torch.bfloat16, causal=False, train=False)
    res["infer_fp32"] = _case(rank, n, torch.float32, causal=False, train=False)
    res["train_causal_fp32"] = _case(rank, n, torch.float32, causal=True, train=True)
    res["train_fp32"] = _case(rank, n, torch.float32, causal=False, train=True)
    res["reduce_overhead"] = _case(
        rank, n, torch.float32, causal=False, train=False, mode="reduce-overhead"
    )
    res["graph_breaks"] = sum(counters["graph_break"].values())
    torch.cuda.synchronize()
    return res


@functools.cache
def _launch(n):
    return values(run_ranks(_worker, n, timeout=560, env={"TOKENRING_XDIT_TRANSPORT": "ipc"}))


@pytest.mark.parametrize("n", [2, 3])
def test_compiled_ring_on_one_gpu_matches_eager_and_exact(n):
    for rank, res in enumerate(_launch(n)):
        print(f"ring {n} rank {rank}: {res}")
        assert res["graph_breaks"] == 0, res
        assert res["ring_vs_exact"] < FP32_TOL, res
        for name in ("infer_bf16", "infer_fp32", "train_causal_fp32", "train_fp32"):
            case = res[name]
            tol = BF16_TOL if "bf16" in name else FP32_TOL
            assert "refused" not in case and case["vs_eager"] < tol, (name, case)
            assert case["frames"] == 1, (name, case)


@pytest.mark.parametrize("n", [2, 3])
def test_reduce_overhead_runs_or_is_refused_clearly(n):
    for res in _launch(n):
        case = res["reduce_overhead"]
        if "refused" in case:
            assert "TokenRing cannot run inside a CUDA graph" in case["refused"], case
        else:
            assert case["vs_eager"] < FP32_TOL, case
