"""The demo's worker: TokenRing vs yunchang's ring vs exact single-process attention.

Every rank builds the same seeded global q/k/v (b, s, h, d), keeps its contiguous slice of the
sequence, and times three methods on the same inputs (warm-up excluded; CUDA events on GPU,
perf_counter on CPU; the slowest rank's time counts):

- "single": exact attention of the full sequence on one device (every rank computes it; it is the
  baseline time a ring must beat, ideally by the ring size);
- "tokenring": `token_ring_attn` over WORLD;
- "yunchang": yunchang 0.6.4's P2P ring `ring_flash_attn_func` over WORLD (on CPU with our
  `cpu_flash` kernel passed as its `attn_processor`, since no yunchang AttnType has a CPU kernel
  with a real lse; on CUDA with AttnType.TORCH_FLASH).

Errors are max |out - ref| and max |lse - ref| against an fp64 reference of the rank's own rows,
reduced (max) to rank 0, which alone returns the results.
"""

from __future__ import annotations

import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from ..ring import setup_token_ring_group, token_ring_attn
from ..ring.kernels import cpu_flash, select_kernel
from ..ring.tensor_layout import BSHD

__all__ = ["DemoConfig", "METHODS", "run_demo", "tolerance"]

METHODS = ("single", "tokenring", "yunchang")
LABELS = {"single": "single process", "tokenring": "TokenRing", "yunchang": "yunchang ring"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class DemoConfig:
    """Resolved settings (no "auto" left): the CLI fills them in."""

    device: str  # "cpu" or "cuda"
    tokens: int  # total sequence length, split evenly over the ranks
    heads: int
    head_size: int
    batch: int
    dtype: str  # a key of DTYPES
    iters: int
    warmup: int
    kernel: str = "auto"  # TokenRing's and the single process's block kernel
    methods: tuple[str, ...] = METHODS
    seed: int = 0


def tolerance(dtype: str) -> float:
    """Largest max |out - ref| against the fp64 reference that counts as correct."""
    return 1e-4 if dtype == "float32" else 3e-2


def run_demo(rank: int, world_size: int, report: Callable[..., None], cfg: DemoConfig):
    """Worker entry for `launch`: returns the results dict on rank 0, None elsewhere."""
    device = torch.device("cuda", rank) if cfg.device == "cuda" else torch.device("cpu")
    dtype = DTYPES[cfg.dtype]
    per_method = cfg.warmup + cfg.iters
    report(description="preparing", total=2 + per_method * len(cfg.methods), completed=0)
    with torch.inference_mode():
        setup_token_ring_group(dist.group.WORLD)
        q, k, v = _global_qkv(cfg, device, dtype)
        rows = _shard_rows(cfg.tokens, rank, world_size)
        q_loc, k_loc, v_loc = (x[:, rows].contiguous() for x in (q, k, v))
        kernel, kernel_fn = select_kernel(cfg.kernel, device, dtype, cfg.head_size, cfg.head_size)
        ref_out, ref_lse = _reference(q_loc, k, v)
        report(description="reference", advance=1)
        calls = {
            "single": lambda: (lambda: kernel_fn(q, k, v, cfg.head_size**-0.5, BSHD), kernel, 1),
            "tokenring": lambda: (
                lambda: token_ring_attn(q_loc, k_loc, v_loc, layout="bshd", kernel=kernel),
                kernel,
                world_size,
            ),
            "yunchang": lambda: (*_yunchang_call(q_loc, k_loc, v_loc, device), world_size),
        }  # built on demand: yunchang is imported only when its ring is asked for
        measured = []
        for name in cfg.methods:
            call, kernel_name, ranks = calls[name]()
            ms, (out, lse) = _time(call, cfg, device, report, LABELS[name])
            if name == "single":  # every rank checks its own rows of the full output
                out, lse = out[:, rows], lse[:, :, rows]
            err_out = (out.double() - ref_out).abs().max().item()
            err_lse = (lse.double() - ref_lse).abs().max().item()
            measured.append((name, kernel_name, ranks, [ms, err_out, err_lse]))
        report(description="reducing", advance=1)
        summary = _reduce([m[3] for m in measured], device)
    if rank != 0:
        return None
    results = [
        {
            "method": name,
            "label": LABELS[name],
            "kernel": kernel_name,
            "ranks": ranks,
            "ms_per_call": ms,
            "max_err_out": err_out,
            "max_err_lse": err_lse,
        }
        for (name, kernel_name, ranks, _), (ms, err_out, err_lse) in zip(
            measured, summary, strict=True
        )
    ]
    return {
        "config": asdict(cfg),
        "world_size": world_size,
        "results": results,
        "tolerance": tolerance(cfg.dtype),
        "environment": _environment(device, world_size),
    }


def _global_qkv(cfg: DemoConfig, device: torch.device, dtype: torch.dtype):
    """The same q, k, v (b, s, h, d) on every rank: drawn on the CPU from one seed."""
    gen = torch.Generator(device="cpu").manual_seed(cfg.seed)
    shape = (cfg.batch, cfg.tokens, cfg.heads, cfg.head_size)
    return tuple(torch.randn(shape, generator=gen).to(device, dtype) for _ in range(3))


def _shard_rows(tokens: int, rank: int, world_size: int) -> slice:
    if tokens % world_size:
        raise ValueError(
            f"--tokens {tokens} must be a multiple of the number of ranks ({world_size}): "
            "yunchang's basic ring needs equal shards"
        )
    local = tokens // world_size
    return slice(rank * local, (rank + 1) * local)


def _reference(q_loc, k, v, budget_bytes: int = 1 << 28):
    """fp64 attention of the local queries against the whole sequence, in query chunks.

    Returns out (b, s_loc, h, d) and lse (b, h, s_loc), both fp64.
    """
    qb, kb, vb = (x.transpose(1, 2).double() for x in (q_loc, k, v))
    b, h, s_loc, d = qb.shape
    chunk = max(1, budget_bytes // (8 * b * h * kb.shape[2]))
    outs, lses = [], []
    for start in range(0, s_loc, chunk):
        scores = (qb[:, :, start : start + chunk] @ kb.transpose(-1, -2)) * d**-0.5
        lse = torch.logsumexp(scores, dim=-1)
        outs.append(torch.exp(scores - lse.unsqueeze(-1)) @ vb)
        lses.append(lse)
    return torch.cat(outs, dim=2).transpose(1, 2), torch.cat(lses, dim=2)


def _yunchang_call(q_loc, k_loc, v_loc, device: torch.device):
    """yunchang's basic P2P ring as a zero-argument call returning (out, lse), and its kernel."""
    from yunchang.kernels import AttnType
    from yunchang.ring.ring_flash_attn import ring_flash_attn_func

    if device.type == "cuda":
        attn_type, processor, kernel = AttnType.TORCH_FLASH, None, "torch_flash"
    else:
        attn_type, processor, kernel = None, _yunchang_cpu_block, "cpu_flash"

    def call():
        out, lse, _ = ring_flash_attn_func(
            q_loc,
            k_loc,
            v_loc,
            softmax_scale=q_loc.shape[3] ** -0.5,
            return_attn_probs=True,
            group=dist.group.WORLD,
            attn_type=attn_type,
            attn_processor=processor,
        )
        return out, lse

    return call, kernel


def _yunchang_cpu_block(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    return_softmax=False,
):
    """yunchang's per-block kernel contract on CPU: (b, s, h, d) in, (out, lse (b, h, s)) out.

    With attn_type=None, `select_flash_attn_impl` falls through to this `attn_processor`.
    """
    if causal or dropout_p or alibi_slopes is not None or softcap or window_size != (-1, -1):
        raise NotImplementedError("the demo's CPU block kernel is plain non-causal attention")
    scale = softmax_scale if softmax_scale is not None else q.shape[3] ** -0.5
    return cpu_flash(q, k, v, scale, BSHD)


def _time(call, cfg: DemoConfig, device: torch.device, report, label: str):
    """ms per call (max over ranks is taken later) and the last call's (out, lse)."""
    for i in range(cfg.warmup):
        result = call()
        report(description=f"{label}: warm-up {i + 1}/{cfg.warmup}", advance=1)
    report(description=f"{label}: timing {cfg.iters} calls")
    _barrier(device)
    if device.type == "cuda":
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        for _ in range(cfg.iters):
            result = call()
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end) / cfg.iters
    else:
        t0 = time.perf_counter()
        for _ in range(cfg.iters):
            result = call()
        ms = (time.perf_counter() - t0) * 1e3 / cfg.iters
    report(advance=cfg.iters)
    return ms, result


def _barrier(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


def _reduce(rows: list[list[float]], device: torch.device) -> list[list[float]]:
    """Element-wise max over ranks, to rank 0 (the slowest rank's time, the worst error)."""
    t = torch.tensor(rows, dtype=torch.float64, device=device)
    dist.reduce(t, dst=0, op=dist.ReduceOp.MAX)
    return t.tolist()


def _environment(device: torch.device, world_size: int) -> dict:
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "backend": dist.get_backend(),
        "device": device.type,
        "ranks": world_size,
        "threads_per_rank": torch.get_num_threads(),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    if "yunchang" in sys.modules:  # only when its ring ran
        env["yunchang"] = getattr(sys.modules["yunchang"], "__version__", "?")
    return env
