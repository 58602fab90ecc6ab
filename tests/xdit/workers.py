"""Rank functions for the xDiT tests, device-agnostic: "cpu" (gloo, CPU mode) or "cuda" (NCCL).

Spawned by `tests.harness.run_ranks` (which has already called init_process_group), every rank
sets xDiT up the way xDiT's own scripts do: CPU mode first on CPU (it must precede the first
`import xfuser`), then `init_distributed_environment`, then an engine config parsed from an argv
with xDiT's own parser (`FlexibleArgumentParser` + `xFuserArgs.add_cli_args`, so the
`--ring_impl_type` flag can be passed like on a command line), then xDiT's runtime state through
`initialize_runtime_state` with a tiny pipeline (exactly what the xFuser*Pipeline wrappers call).

One launch serves many cases (CI has 2 cores): `run_xdit` runs the parts listed in its spec and
returns plain Python/numpy (tensors cross the result queue as shared-memory handles that die with
the rank process). Every TokenRing run reports TokenRing's own counters and the number of calls
of `tokenring_xdit.hosts.xdit.usp_ring_attn` and of xDiT's torch ring
(`usp._templated_ring_attention`), so a silent fall-back to xDiT's ring cannot pass for TokenRing,
nor the other way round.

The same module computes the references (exact fp64 attention, plain diffusers on one device) so
that test files and the GPU test share one definition of inputs and outputs.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from typing import Any

import numpy as np
import torch

# Attention shapes of the USP / long-context cases: batch, heads (divisible by ulysses 2),
# head size, local sequence per SP rank, joint (text) tokens, and the KV-cache-like case's
# local query / key lengths (PipeFusion: K/V longer than Q).
B, H, D = 2, 4, 16
LOCAL, JOINT = 6, 5
KV_Q, KV_KV = 4, 10

STEPS = 2
PIXART_GUIDANCE = 4.5  # xfuser's PixArt wrapper needs classifier-free guidance
FLUX_GUIDANCE = 3.5
TEXT_LEN = 16  # divisible by every SP degree used: xDiT's Flux splits the text over SP ranks

USP_CASES = ("plain", "joint_front", "joint_rear", "kv_longer")
LONG_CTX_CASES = (
    "token_ring/plain",
    "token_ring/joint_front",
    "token_ring/joint_rear",
    "token_ring/torch_math",
    "token_ring/kv_cache_layer",
    "token_ring/kv_cache_registered",
    "selected/plain",
)
TOKEN_RING, DEFAULT = "token_ring", "default"


# ------------------------------------------------------------------------------------------
# Inputs and references (pure functions: the test process rebuilds the same tensors).


def global_inputs(sp: int, ring: int) -> dict[str, torch.Tensor]:
    """Global (b, h, s, d) fp64 tensors on CPU, identical in every process.

    q/k/v: the whole sequence, SP rank p owns rows [p*LOCAL, (p+1)*LOCAL); jq/jk/jv: the joint
    (text) tokens every rank holds; cq/ck/cv: the K/V-longer-than-Q case, ring rank j owns rows
    j*KV_Q.. of cq and j*KV_KV.. of ck/cv.
    """
    gen = torch.Generator().manual_seed(1234)

    def randn(s: int) -> torch.Tensor:
        return torch.randn(B, H, s, D, generator=gen, dtype=torch.float64)

    names_lens = [
        ("q", sp * LOCAL),
        ("k", sp * LOCAL),
        ("v", sp * LOCAL),
        ("jq", JOINT),
        ("jk", JOINT),
        ("jv", JOINT),
        ("cq", ring * KV_Q),
        ("ck", ring * KV_KV),
        ("cv", ring * KV_KV),
    ]
    return {name: randn(n) for name, n in names_lens}


def _rows(x: torch.Tensor, index: int, size: int) -> torch.Tensor:
    return x[:, :, index * size : (index + 1) * size]


def exact_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Softmax attention in fp64, (b, h, s, d), default scale."""
    return torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double())


def expected_rows(
    case: str, sp: int, ring: int, sp_rank: int, ring_rank: int, dtype=torch.float64
) -> torch.Tensor:
    """Exact output of one rank for one case, (b, h, s, d) fp64, from the inputs as the ranks
    held them (rounded to `dtype`).

    Keys are a set under softmax (no mask, no position inside attention), so a query meets the
    concatenation of every rank's K/V plus the joint K/V once, whatever the order. The joint query
    rows sit before ("front") or after ("rear") the rank's own rows, as xDiT concatenates them.
    """
    x = {k: t.to(dtype).double() for k, t in global_inputs(sp, ring).items()}
    if case.endswith("kv_longer"):
        return exact_attention(_rows(x["cq"], ring_rank, KV_Q), x["ck"], x["cv"])
    q = _rows(x["q"], sp_rank, LOCAL)
    if "joint" not in case:
        return exact_attention(q, x["k"], x["v"])
    k, v = torch.cat([x["k"], x["jk"]], dim=2), torch.cat([x["v"], x["jv"]], dim=2)
    rows = [x["jq"], q] if case.endswith("front") else [q, x["jq"]]
    return exact_attention(torch.cat(rows, dim=2), k, v)


def pipeline_inputs(model: str, device: str, dtype: torch.dtype):
    """(pipeline, call kwargs, number of ring calls per rank) for a tiny random pipeline.

    Same weights, prompt embeddings and starting latents in every process (seeded on CPU).
    """
    from tokenring_xdit.tools import pipelines

    built = pipelines.BUILDERS[model]("tiny", seed=0, dtype=dtype, device=device, text_len=TEXT_LEN)
    pipe = built.pipe
    gen = torch.Generator().manual_seed(1)
    if model == "pixart":
        from diffusers import DDIMScheduler

        # The builder's DPM-Solver++ turns the random model's noise prediction into latents of
        # ~600 (x0 = (x - sigma*eps)/alpha at alpha ~ 0.006), where fp32 rounding alone moves the
        # result by ~1e-4; DDIM keeps them ~13, so an absolute fp32 bound still means something.
        pipe.scheduler = DDIMScheduler(clip_sample=False)
        shape = (1, 4, built.height // pipe.vae_scale_factor, built.width // pipe.vae_scale_factor)
        extra = dict(guidance_scale=PIXART_GUIDANCE)
        # xDiT wraps the self-attention of each block; the CFG batch goes through together
        ring_calls = pipe.transformer.config.num_layers * STEPS
    else:
        tokens = (built.height // pipe.vae_scale_factor // 2) * (
            built.width // pipe.vae_scale_factor // 2
        )
        shape = (1, tokens, pipe.transformer.config.in_channels)  # packed 2x2 latents
        extra = dict(guidance_scale=FLUX_GUIDANCE, max_sequence_length=TEXT_LEN)
        conf = pipe.transformer.config
        ring_calls = (conf.num_layers + conf.num_single_layers) * STEPS
    latents = torch.randn(shape, generator=gen).to(device, dtype)
    kwargs = dict(
        built.call_kwargs,
        height=built.height,
        width=built.width,
        num_inference_steps=STEPS,
        latents=latents,
        output_type="latent",
        **extra,
    )
    return pipe.to(device), kwargs, ring_calls


def plain_pipeline_latents(model: str, device: str, dtype: torch.dtype) -> np.ndarray:
    """Plain diffusers on one device: the reference latents, as fp32 numpy."""
    pipe, kwargs, _ = pipeline_inputs(model, device, dtype)
    with torch.no_grad():
        out = pipe(**kwargs).images
    return _np(out)


def _np(x: torch.Tensor) -> np.ndarray:
    return x.detach().float().cpu().numpy().copy()


# ------------------------------------------------------------------------------------------
# Set-up inside a rank.


def _argv(spec: dict) -> list[str]:
    """The command line a user would give xDiT's example scripts."""
    argv = [
        "--model",
        "tiny-random",  # never loaded: pipelines are built in memory
        "--ulysses_degree",
        str(spec["ulysses"]),
        "--ring_degree",
        str(spec["ring"]),
        "--num_inference_steps",
        str(STEPS),
        "--output_type",
        "latent",
        "--no_use_resolution_binning",
    ]
    return argv + list(spec.get("argv", ()))


def _set_up(rank: int, world_size: int, spec: dict):
    """CPU mode (on CPU), xfuser, xDiT's world group and engine config; returns the config.

    spec["install"]: call tokenring_xdit.install() first, for an environment where the package
    is only on PYTHONPATH (no .pth bootstrap, no entry points); otherwise the patches come from
    the automatic post-import hooks, as for a user who installed the package.
    """
    if spec.get("install"):
        import tokenring_xdit

        tokenring_xdit.install()
    if spec["device"] == "cpu":
        from tokenring_xdit.patches import xfuser_cpu

        if "xfuser" in sys.modules:
            raise AssertionError("xfuser was imported before CPU mode was enabled")
        xfuser_cpu.enable()
    from xfuser import xFuserArgs
    from xfuser.config import FlexibleArgumentParser
    from xfuser.core.distributed import init_distributed_environment

    # The harness already called init_process_group; xDiT then only builds its world group.
    init_distributed_environment(rank=rank, world_size=world_size, local_rank=rank)
    parser = FlexibleArgumentParser(description="xFuser Arguments")
    args = xFuserArgs.add_cli_args(parser).parse_args(_argv(spec))
    engine_args = xFuserArgs.from_cli_args(args)
    engine_config, _ = engine_args.create_config()
    return engine_config


def _device(spec: dict, rank: int) -> str:
    return f"cuda:{rank}" if spec["device"] == "cuda" else "cpu"


class _Calls:
    """Counts calls into TokenRing's xDiT entry point, into xDiT's own torch ring and into xDiT's
    K/V cache update, and what TokenRing's entry point received (local query lengths, joint
    K/V or not)."""

    def __init__(self) -> None:
        import xfuser.model_executor.layers.usp as usp

        import tokenring_xdit.hosts.xdit as xdit_ring

        self.reset()
        # module globals, looked up at call time by the dispatcher and by xDiT's ring_attn
        xdit_ring.usp_ring_attn = self._counting(xdit_ring.usp_ring_attn, "usp_ring_attn")
        usp._templated_ring_attention = self._counting(
            usp._templated_ring_attention, "templated_ring"
        )
        # USP's K/V cache step (a cat and two copies without PipeFusion), which TokenRing skips
        from xfuser.core.cache_manager.cache_manager import CacheManager

        CacheManager.update_and_get_kv_cache = self._counting(
            CacheManager.update_and_get_kv_cache, "kv_cache_steps"
        )

    def _counting(self, fn, key: str):
        def counted(*args, **kwargs):
            self.counts[key] += 1
            if key == "usp_ring_attn":
                query = args[1] if len(args) > 1 else kwargs["query"]
                self.q_lens.add(int(query.shape[2]))
                if kwargs.get("joint_attn_kwargs") is not None:
                    self.counts["usp_ring_attn_joint"] += 1
            return fn(*args, **kwargs)

        counted.__wrapped__ = fn
        return counted

    def reset(self) -> None:
        self.counts = {
            "usp_ring_attn": 0, "usp_ring_attn_joint": 0, "templated_ring": 0, "kv_cache_steps": 0
        }  # fmt: skip
        self.q_lens: set[int] = set()

    def report(self) -> dict:
        return dict(self.counts, ring_q_lens=sorted(self.q_lens))


def _run_counted(calls: _Calls, fn) -> dict:
    """fn() with TokenRing's traffic counters and the call counts reset before; both after."""
    from tokenring_xdit.ring.comm import COUNTERS

    COUNTERS.reset()
    calls.reset()
    with torch.no_grad():
        out = fn()
    return dict(
        out=out,
        kernel_calls=COUNTERS.kernel_calls,
        q_messages=COUNTERS.q_messages,
        partial_messages=COUNTERS.partial_messages,
        **calls.report(),
    )


def _select(impl: str | None) -> None:
    """impl None: leave the choice to the flag / environment (the user's way)."""
    if impl is not None:
        from tokenring_xdit.hosts import selection

        selection.set_xdit_ring_impl(impl)


# ------------------------------------------------------------------------------------------
# Parts.


def _usp_part(rank: int, spec: dict, calls: _Calls) -> dict:
    """xDiT's USP (and usp.ring_attn for K/V longer than Q) per case and ring implementation."""
    import xfuser.model_executor.layers.usp as usp
    from xfuser.core.distributed import (
        get_ring_parallel_rank,
        get_ring_parallel_world_size,
        get_sequence_parallel_rank,
        get_sequence_parallel_world_size,
    )

    device, dtype = _device(spec, rank), getattr(torch, spec["dtype"])
    sp, ring = get_sequence_parallel_world_size(), get_ring_parallel_world_size()
    sp_rank, ring_rank = get_sequence_parallel_rank(), get_ring_parallel_rank()
    x = {k: t.to(device, dtype) for k, t in global_inputs(sp, ring).items()}
    q, k, v = (_rows(x[n], sp_rank, LOCAL) for n in ("q", "k", "v"))
    cq = _rows(x["cq"], ring_rank, KV_Q)
    ck, cv = (_rows(x[n], ring_rank, KV_KV) for n in ("ck", "cv"))
    joint = dict(joint_query=x["jq"], joint_key=x["jk"], joint_value=x["jv"])
    cases = {
        "plain": lambda: usp.USP(q, k, v),
        "joint_front": lambda: usp.USP(q, k, v, **joint, joint_strategy="front"),
        "joint_rear": lambda: usp.USP(q, k, v, **joint, joint_strategy="rear"),
        # PipeFusion's KV cache makes the local K/V longer than the local Q before the ring;
        # this is the ring step USP runs then, with xDiT's own selected kernel
        "kv_longer": lambda: usp.ring_attn(usp._get_attention_function(), cq, ck, cv),
    }
    results: dict[str, Any] = dict(sp_rank=sp_rank, ring_rank=ring_rank, sp=sp, ring=ring)
    for impl in spec["impls"]:
        _select(impl)
        for name in spec.get("usp_cases", USP_CASES):
            run = _run_counted(calls, cases[name])
            run["out"] = _np(run["out"])
            results[f"{impl}/{name}"] = run
    if ring > 1:  # ring ranks that chose different rings: one ValueError on each, no hang
        from tokenring_xdit.hosts import selection

        saved = selection.CHOSEN.python
        _select("token_ring" if ring_rank == 0 else "default")
        try:
            cases["plain"]()
            results["mismatch"] = "no error"
        except ValueError as exc:
            results["mismatch"] = str(exc)
        selection.set_xdit_ring_impl(saved)
        results["after_mismatch"] = _np(cases["plain"]())
    return results


def _long_ctx_inputs(rank: int, spec: dict) -> dict[str, torch.Tensor]:
    """This rank's (b, s, h, d) q/k/v (its SP rows) and the joint tensors."""
    from xfuser.core.distributed import (
        get_ring_parallel_world_size,
        get_sequence_parallel_rank,
        get_sequence_parallel_world_size,
    )

    device, dtype = _device(spec, rank), getattr(torch, spec["dtype"])
    sp, ring = get_sequence_parallel_world_size(), get_ring_parallel_world_size()
    x = {k: t.to(device, dtype) for k, t in global_inputs(sp, ring).items()}
    rank_rows = {n: _rows(x[n], get_sequence_parallel_rank(), LOCAL) for n in ("q", "k", "v")}
    return {n: t.transpose(1, 2).contiguous() for n, t in dict(x, **rank_rows).items()}


def _long_ctx_run(calls: _Calls, layer, x: dict, attn=None, **kwargs) -> dict:
    from tokenring_xdit.hosts import xdit as xdit_ring

    run = _run_counted(calls, lambda: layer(attn, x["q"], x["k"], x["v"], **kwargs))
    run["out"] = _np(run["out"].transpose(1, 2))  # back to (b, h, s, d)
    run["ring_fn"] = getattr(layer.ring_attn_fn, "__qualname__", repr(layer.ring_attn_fn))
    fn = layer.ring_attn_fn  # TokenRing itself, or the per-call dispatcher that agrees on it
    run["ring_fn_is_token_ring"] = xdit_ring.long_ctx_ring_attn in (
        fn,
        getattr(fn, "__wrapped__", None),
    )
    return run


def _long_ctx_part(rank: int, spec: dict, calls: _Calls) -> dict:
    """xFuserLongContextAttention (b, s, h, d) with TokenRing, per case; ulysses x ring."""
    from xfuser.core.cache_manager.cache_manager import get_cache_manager
    from xfuser.core.distributed import get_ring_parallel_rank, get_sequence_parallel_rank
    from xfuser.core.long_ctx_attention import (
        xFuserLongContextAttention,
        xFuserSanaLinearLongContextAttention,
    )
    from xfuser.core.long_ctx_attention.ring import (
        xdit_ring_flash_attn_func,
        xdit_sana_ring_flash_attn_func,
    )
    from yunchang.kernels import AttnType

    from tokenring_xdit.hosts import selection

    x = _long_ctx_inputs(rank, spec)
    joint = dict(joint_tensor_query=x["jq"], joint_tensor_key=x["jk"], joint_tensor_value=x["jv"])
    results: dict[str, Any] = dict(
        sp_rank=get_sequence_parallel_rank(), ring_rank=get_ring_parallel_rank()
    )
    selection.set_xdit_ring_impl(DEFAULT)  # the layer's own argument must be enough
    layer = xFuserLongContextAttention(ring_impl_type=TOKEN_RING)
    results["token_ring/plain"] = _long_ctx_run(calls, layer, x)
    for strategy in ("front", "rear"):
        results[f"token_ring/joint_{strategy}"] = _long_ctx_run(
            calls, layer, x, **joint, joint_strategy=strategy
        )
    math = xFuserLongContextAttention(ring_impl_type=TOKEN_RING, attn_type=AttnType.TORCH_MATH)
    results["token_ring/torch_math"] = _long_ctx_run(calls, math, x)
    # use_kv_cache=True with token_ring raised a RuntimeError in __init__ before the patch; with
    # no attention module (attn=None) the layer has no cache entry and K/V pass through
    cached = xFuserLongContextAttention(ring_impl_type=TOKEN_RING, use_kv_cache=True)
    results["token_ring/kv_cache_layer"] = _long_ctx_run(calls, cached, x)
    results["token_ring/kv_cache_layer"]["use_kv_cache"] = cached.use_kv_cache
    # ... and with the module's cache entry registered, as PipeFusion does: TokenRing's ring
    # function goes through xDiT's cache manager (outside PipeFusion's patch mode the cache
    # hands back this step's K/V)
    module = torch.nn.Module()
    get_cache_manager().register_cache_entry(module, layer_type="attn")
    results["token_ring/kv_cache_registered"] = _long_ctx_run(calls, cached, x, attn=module)
    cache = get_cache_manager().cache["attn", module].tensors[0]
    results["token_ring/kv_cache_registered"]["cached_shape"] = list(cache.shape)
    # the global selection alone: ring_impl_type stays xDiT's default "basic"
    selection.set_xdit_ring_impl(TOKEN_RING)
    results["selected/plain"] = _long_ctx_run(calls, xFuserLongContextAttention(), x)
    # not selected, "basic": xDiT's own ring function, untouched (not run: it has no CPU kernel)
    selection.set_xdit_ring_impl(DEFAULT)
    basic = xFuserLongContextAttention(ring_impl_type="basic")
    results["basic_ring_fn_is_xdit"] = basic.ring_attn_fn is xdit_ring_flash_attn_func
    results["basic_ring_fn"] = getattr(basic.ring_attn_fn, "__qualname__", "?")
    # Sana's linear attention keeps its own (non-softmax) ring even with TokenRing selected
    selection.set_xdit_ring_impl(TOKEN_RING)
    sana = xFuserSanaLinearLongContextAttention()
    results["sana_ring_fn_is_xdit"] = sana.ring_attn_fn is xdit_sana_ring_flash_attn_func
    results["sana_ring_fn"] = getattr(sana.ring_attn_fn, "__qualname__", "?")
    selection.set_xdit_ring_impl(None)
    return results


def _long_ctx_env_part(rank: int, spec: dict, calls: _Calls) -> dict:
    """xFuserLongContextAttention() as a model builds it, the choice left to flag/environment."""
    from xfuser.core.distributed import get_sequence_parallel_rank
    from xfuser.core.long_ctx_attention import xFuserLongContextAttention

    run = _long_ctx_run(calls, xFuserLongContextAttention(), _long_ctx_inputs(rank, spec))
    run["sp_rank"] = get_sequence_parallel_rank()
    return run


def _pipeline_part(rank: int, spec: dict, engine_config, calls: _Calls, model: str) -> dict:
    """xFuser<Model>Pipeline around the tiny pipeline, once per ring implementation."""
    from xfuser import xFuserFluxPipeline, xFuserPixArtAlphaPipeline
    from xfuser.core.distributed import get_runtime_state

    wrapper = {"pixart": xFuserPixArtAlphaPipeline, "flux": xFuserFluxPipeline}[model]
    device, dtype = _device(spec, rank), getattr(torch, spec["dtype"])
    pipe, kwargs, ring_calls = pipeline_inputs(model, device, dtype)
    xpipe = wrapper(pipe, engine_config)
    results: dict[str, Any] = dict(
        expected_ring_calls=ring_calls, backend=get_runtime_state().attention_backend.name
    )
    from tokenring_xdit.hosts.transformer_graphs import graph_stats

    for impl in spec["impls"]:
        print(f"[xdit rank {rank}] {model} with {impl}", file=sys.stderr, flush=True)
        _select(impl)
        run = _run_counted(calls, lambda: xpipe(**kwargs))
        out = run.pop("out")
        run["latents"] = None if out is None else _np(out.images)
        stats = graph_stats(pipe.transformer)  # TOKENRING_XDIT_CUDA_GRAPH_TRANSFORMER=1 only
        run["graph"] = None if stats is None else dict(vars(stats))
        results[str(impl)] = run
    last = torch.distributed.get_rank() == torch.distributed.get_world_size() - 1
    if spec.get("reference") and last:  # plain diffusers on this one device (GPU test)
        print(f"[xdit rank {rank}] {model} reference", file=sys.stderr, flush=True)
        results["reference"] = plain_pipeline_latents(model, device, dtype)
    return results


def _graph_gate_part(rank: int, spec: dict, engine_config, announced) -> dict:
    """Wrap (not run) the tiny PixArt: did the transformer get a graphed forward, what was said."""
    from xfuser import xFuserPixArtAlphaPipeline

    from tokenring_xdit.hosts.transformer_graphs import graph_stats

    device, dtype = _device(spec, rank), getattr(torch, spec["dtype"])
    pipe, _, _ = pipeline_inputs("pixart", device, dtype)
    before = len(announced.messages)
    xFuserPixArtAlphaPipeline(pipe, engine_config)
    return dict(
        graphed=graph_stats(pipe.transformer) is not None,
        warnings=announced.messages[before:],
    )


class _ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def run_xdit(rank: int, world_size: int, spec: dict) -> dict:
    """One rank of a launch. spec: device ("cpu"/"cuda"), dtype ("float32"/"bfloat16"),
    ulysses, ring, impls (ring implementations to run, None = leave the choice to flag/env),
    parts (subset of "usp", "long_ctx", "long_ctx_env", "pixart", "flux"), usp_cases, argv
    (extra xDiT flags), reference (the last rank also runs plain diffusers on its device),
    install (see _set_up).

    A part that raises is reported as {"error": traceback} and the next part still runs.
    """
    # TokenRing's rank-0 announcement, as it reaches xDiT's log
    announced = _ListHandler()
    logging.getLogger("xfuser.tokenring_xdit").addHandler(announced)
    t0 = time.monotonic()
    engine_config = _set_up(rank, world_size, spec)
    calls = _Calls()
    from xfuser.core.distributed import get_runtime_state, initialize_runtime_state

    from tokenring_xdit.hosts import selection

    device, dtype = _device(spec, rank), getattr(torch, spec["dtype"])
    results: dict[str, Any] = dict(rank=rank)
    parts = spec.get("parts", ("usp", "long_ctx", "pixart", "flux"))
    if {"usp", "long_ctx", "long_ctx_env"} & set(parts):
        # xDiT's runtime state (parallel groups, attention backend) as a pipeline wrapper sets it
        pipe, _, _ = pipeline_inputs("pixart", device, dtype)
        initialize_runtime_state(pipeline=pipe, engine_config=engine_config)
        results["backend"] = get_runtime_state().attention_backend.name
    for part in parts:
        # progress on stderr: a launch cut by its timeout still says which part each rank was in
        print(f"[xdit rank {rank}] part {part} starts at {time.monotonic() - t0:.1f} s",
              file=sys.stderr, flush=True)  # fmt: skip
        try:
            if part == "usp":
                results[part] = _usp_part(rank, spec, calls)
            elif part == "long_ctx":
                results[part] = _long_ctx_part(rank, spec, calls)
            elif part == "long_ctx_env":
                results[part] = _long_ctx_env_part(rank, spec, calls)
            elif part == "graph_gate":
                results[part] = _graph_gate_part(rank, spec, engine_config, announced)
            else:
                results[part] = _pipeline_part(rank, spec, engine_config, calls, part)
        except Exception as exc:
            results[part] = dict(
                error=f"{type(exc).__name__}: {exc}",
                error_type=type(exc).__name__,
                trace=traceback.format_exc(),
            )
    try:
        results["selection"] = list(selection.xdit_ring_impl())
    except ValueError as exc:
        results["selection"] = f"ValueError: {exc}"
    results["announced"] = announced.messages
    return results
