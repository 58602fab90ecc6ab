"""diffusers' own context parallelism end to end: TokenRing vs diffusers' ring and ulysses.

  torchrun --nproc_per_node=2 -m benchmarks diffusers_cp --model wan flux --out $OUT/dcp_2.json
  torchrun --nproc_per_node=4 -m benchmarks diffusers_cp --model wan flux --out $OUT/dcp_4.json
  torchrun --nproc_per_node=2 -m benchmarks diffusers_cp --tiny --out dcp_tiny.json  # CPU, gloo

Models (seeded random weights from a config, bf16 on GPU, nothing downloaded):
  wan   WanTransformer3DModel, Wan 2.1 T2V sizes (--wan-size 1.3b: dim 1536, 30 layers, 12 heads;
        14b: 5120, 40, 40), 480p x 81 frames: latents 16 x 21 x 60 x 104, patch (1, 2, 2) ->
        32760 video tokens in self-attention; 512 text tokens (cross-attention, not sharded)
  flux  FluxTransformer2DModel, Flux.1-dev sizes (19 + 38 blocks, 24 heads x 128), --flux-px
        2048: 16384 image + 512 text tokens in one joint attention
--layers N cuts depth for time: Wan keeps N blocks, Flux N double-stream and 2N single-stream.
The transformer runs alone, not the pipeline: a fixed flow-matching Euler loop (sigma from 1 to 0
in --steps steps, x += dsigma * v) from the same seeded noise and text embeddings, so every
backend gets the same inputs; text encoders and VAE take no part in attention and are left out.

Settings: every ulysses x ring split of the N ranks (N = 2: ring 2, ulysses 2; N = 4: ring 4,
ulysses 2 x ring 2, ulysses 4). Backends, all on --attention-backend (_native_cudnn by default;
_native_flash also returns the lse a ring needs; 'flash' and 'sage' need packages the GPU image
lacks, 'native' has no lse):
  token_ring         diffusers' ring path with TokenRing as the ring (tokenring_xdit's patch)
  diffusers_ring     diffusers' TemplatedRingAttention (all-gather of K/V, then local merges)
  diffusers_ulysses  diffusers' all-to-all attention (ulysses-only settings: no ring to replace)
Per run: ms per transformer forward (CUDA events after --warmup forwards, slowest rank per step),
efficiency t1 / (N t) against the one-GPU reference run in the same process (every rank, same
weights), the final latents against that reference (max |err|, relative L2), bytes each rank
sends per step (from the shapes), TokenRing calls per step; on GPU one more forward under
torch.profiler (profile_ring_call.kernel_ms): attention busy, NCCL outside attention, other
kernels outside both, GPU idle. `verdicts`: the faster backend per setting and the fastest run
per model, with the measured part of the step that makes the difference; `yardstick`: diffusers'
ring against its ulysses, the difference two exact bf16 methods show.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from _cp_verdicts import errors, table, verdicts, yardstick  # benchmarks/ is on sys.path

WAN_COMMON = dict(
    patch_size=(1, 2, 2), attention_head_dim=128, in_channels=16, out_channels=16,
    text_dim=4096, freq_dim=256, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
    eps=1e-6, rope_max_seq_len=1024,
)  # fmt: skip
WAN_SIZES = {
    "1.3b": dict(num_attention_heads=12, ffn_dim=8960, num_layers=30),
    "14b": dict(num_attention_heads=40, ffn_dim=13824, num_layers=40),
}
WAN_TINY = dict(
    WAN_COMMON, attention_head_dim=16, in_channels=4, out_channels=4, text_dim=16, freq_dim=32,
    num_attention_heads=4, ffn_dim=32, num_layers=2, rope_max_seq_len=32,
)  # fmt: skip
WAN_LATENTS = {"real": (21, 60, 104), "tiny": (2, 8, 8)}  # frames, height, width in latents
TEXT_TOKENS = {"real": 512, "tiny": 8}
BACKENDS = {"token_ring": "token_ring", "diffusers_ring": "default"}  # -> set_ring_impl
_START = time.perf_counter()


@dataclass
class Problem:
    """One transformer with its fixed inputs; `inputs(x, sigma)` is one denoising forward's."""

    name: str
    model: torch.nn.Module
    noise: torch.Tensor  # fp32 latents, the same on every rank
    fixed: dict
    t_scale: float  # timestep = sigma * t_scale (Flux takes sigma, Wan 1000 sigma)
    tokens: int  # tokens in one context-parallel attention call
    heads: int
    head_dim: int
    attention_calls: int  # context-parallel attention calls per forward

    def inputs(self, x: torch.Tensor, sigma: float) -> dict:
        dtype = self.model.dtype
        t = torch.full((1,), sigma * self.t_scale, device=x.device, dtype=dtype)
        return dict(self.fixed, hidden_states=x.to(dtype), timestep=t, return_dict=False)


def say(msg: str) -> None:
    if dist.get_rank() == 0:
        print(f"[diffusers_cp +{time.perf_counter() - _START:5.1f}s] {msg}", flush=True)


def _build(cls, cfg: dict, device, dtype, seed: int) -> torch.nn.Module:
    """The model in `dtype` on `device`, the same weights on every rank (rank 0's, broadcast)."""
    from tokenring_xdit.tools.pipelines import building

    torch.manual_seed(seed)
    with building(device, dtype):
        model = cls(**cfg).eval()
    for t in (*model.parameters(), *model.buffers()):
        dist.broadcast(t.data, src=0)
    return model


def _randn(gen, *shape, device) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(device)


def wan(args, device, dtype) -> Problem:
    from diffusers import WanTransformer3DModel

    size = "tiny" if args.tiny else "real"
    cfg = WAN_TINY if args.tiny else dict(WAN_COMMON, **WAN_SIZES[args.wan_size])
    cfg = dict(cfg, num_layers=args.layers or cfg["num_layers"])
    model = _build(WanTransformer3DModel, cfg, device, dtype, args.seed)
    (frames, h, w), (pt, ph, pw) = WAN_LATENTS[size], cfg["patch_size"]
    gen = torch.Generator().manual_seed(args.seed + 1)
    noise = _randn(gen, 1, cfg["in_channels"], frames, h, w, device=device)
    text = _randn(gen, 1, TEXT_TOKENS[size], cfg["text_dim"], device=device).to(dtype)
    name = "wan-tiny" if args.tiny else f"wan-{args.wan_size}"
    return Problem(
        name, model, noise, dict(encoder_hidden_states=text), 1000.0,
        frames // pt * (h // ph) * (w // pw), cfg["num_attention_heads"],
        cfg["attention_head_dim"], cfg["num_layers"],
    )  # fmt: skip


def flux(args, device, dtype) -> Problem:
    from diffusers import FluxTransformer2DModel

    from tokenring_xdit.tools.pipelines import FLUX_FULL, FLUX_TINY

    cfg = dict(FLUX_TINY if args.tiny else FLUX_FULL)
    if args.layers:
        cfg.update(num_layers=args.layers, num_single_layers=2 * args.layers)
    model = _build(FluxTransformer2DModel, cfg, device, dtype, args.seed)
    conf = model.config
    side = 8 if args.tiny else args.flux_px // 16  # 8x VAE, then 2x2 latent packing
    text = TEXT_TOKENS["tiny" if args.tiny else "real"]
    gen = torch.Generator().manual_seed(args.seed + 1)
    img_ids = torch.zeros(side * side, 3, device=device)
    img_ids[:, 1] = torch.arange(side, device=device).repeat_interleave(side)  # row
    img_ids[:, 2] = torch.arange(side, device=device).repeat(side)  # column
    fixed = dict(  # positions stay fp32, as FluxPipeline passes them
        encoder_hidden_states=_randn(gen, 1, text, conf.joint_attention_dim, device=device),
        pooled_projections=_randn(gen, 1, conf.pooled_projection_dim, device=device),
        guidance=torch.full((1,), 3.5, device=device),
    )
    fixed = {k: v.to(dtype) for k, v in fixed.items()}
    fixed.update(img_ids=img_ids, txt_ids=torch.zeros(text, 3, device=device))
    noise = _randn(gen, 1, side * side, conf.in_channels, device=device)
    name = "flux-tiny" if args.tiny else f"flux-{args.flux_px}px"
    return Problem(
        name, model, noise, fixed, 1.0, side * side + text, conf.num_attention_heads,
        conf.attention_head_dim, conf.num_layers + conf.num_single_layers,
    )  # fmt: skip


MODELS = {"wan": wan, "flux": flux}


class StepClock:
    """ms of each timed forward: CUDA events on GPU (read once at the end), wall time on CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []

    @contextlib.contextmanager
    def step(self):
        if self.cuda:
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            yield
            end.record()
            self.marks.append((start, end))
        else:
            t = time.perf_counter()
            yield
            self.marks.append(time.perf_counter() - t)

    def ms(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [s.elapsed_time(e) for s, e in self.marks]
        return [1e3 * m for m in self.marks]


def denoise(model, problem: Problem, steps: int, clock: StepClock) -> torch.Tensor:
    """Fixed flow-matching Euler loop from the seeded noise; the final latents (fp32)."""
    x = problem.noise.clone()
    sigmas = torch.linspace(1.0, 0.0, steps + 1).tolist()
    for i in range(steps):
        with clock.step():
            v = model(**problem.inputs(x, sigmas[i]))[0]
        x = x + (sigmas[i + 1] - sigmas[i]) * v.float()
    return x


def sent_bytes(problem: Problem, backend: str, ulysses: int, ring: int, elt: int) -> dict:
    """Bytes one rank sends per forward, from the shapes: the ulysses all-to-alls (q, k, v in,
    out back: (u-1)/u of each leaves) and the ring's transfers (diffusers: the all-gather of its
    K/V shard to ring-1 peers; TokenRing: ring-1 Q hops and as many partials home, out in the
    input dtype and lse in fp32)."""
    shard = problem.tokens // (ulysses * ring) * problem.heads * problem.head_dim
    a2a = 4 * shard * (ulysses - 1) // ulysses * elt
    per_hop = {
        "token_ring": 2 * shard * elt + shard // problem.head_dim * 4,
        "diffusers_ring": 2 * shard * elt,
    }.get(backend, 0)
    calls = problem.attention_calls
    return dict(a2a_bytes_per_step=calls * a2a, ring_bytes_per_step=calls * (ring - 1) * per_hop)


def _slowest(values: list[float], device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # a step is as slow as its slowest rank
    return t.tolist()


def _profile(model, problem: Problem) -> dict:
    """One forward under torch.profiler: kernel ms by kind and the step's timeline."""
    from profile_ring_call import kernel_ms  # benchmarks/ is on sys.path

    timeline: dict = {}
    kinds = kernel_ms(lambda: model(**problem.inputs(problem.noise, 1.0)), 1, timeline)
    return dict(kernels_ms=kinds, timeline=timeline)


def run(model, problem: Problem, args, device) -> tuple[dict, torch.Tensor]:
    """Warm-up forwards, the timed loop, then (GPU) one profiled forward."""
    import tokenring_xdit
    from tokenring_xdit.ring.comm import COUNTERS

    def calls() -> int:
        return tokenring_xdit.calls_by_host().get("diffusers", 0)

    with torch.no_grad():
        for _ in range(args.warmup):
            model(**problem.inputs(problem.noise, 1.0))
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        calls0, bytes0, clock = calls(), COUNTERS.bytes_sent, StepClock(device)
        latents = denoise(model, problem, args.steps, clock)
        ms = _slowest(clock.ms(), device)
        row = dict(
            step_ms=ms,
            median_step_ms=statistics.median(ms),
            token_ring_calls_per_step=(calls() - calls0) / args.steps,
        )
        if device.type == "cpu":  # eager TokenRing posts every transfer through its counters
            row["p2p_bytes_counted_per_step"] = (COUNTERS.bytes_sent - bytes0) / args.steps
        if args.profile and device.type == "cuda":
            row["profile"] = _profile(model, problem)
    return row, latents


def settings(n: int, wanted: list[str] | None) -> list[tuple[int, int]]:
    """(ulysses, ring) splits of n ranks: ring n first, ulysses n last."""
    out = [(u, n // u) for u in range(1, n + 1) if n % u == 0]
    return [s for s in out if wanted is None or label(*s) in wanted]


def label(ulysses: int, ring: int) -> str:
    if ulysses == 1:
        return f"ring{ring}"
    return f"ulysses{ulysses}" if ring == 1 else f"ulysses{ulysses}xring{ring}"


def bench_model(problem: Problem, args, device, n: int) -> list[dict]:
    """The one-GPU reference, then every setting and backend; rows of one model."""
    from diffusers import ContextParallelConfig

    import tokenring_xdit

    base = problem.model
    base.set_attention_backend(args.attention_backend)
    elt = torch.empty((), dtype=base.dtype).element_size()
    common = dict(model=problem.name, tokens=problem.tokens, heads=problem.heads, ranks=n)
    ref_row, reference = run(base, problem, args, device)
    rows = [dict(common, setting="one_gpu", backend=args.attention_backend, **ref_row)]
    say(f"{problem.name}: one GPU {ref_row['median_step_ms']:.1f} ms/step")
    shared = {id(p): p for p in base.parameters()}  # the copies share the weights
    for ulysses, ring in settings(n, args.settings):
        if problem.heads % ulysses:
            say(f"{problem.name}: {label(ulysses, ring)} skipped, {problem.heads} heads")
            continue
        tokenring_xdit.set_ring_impl("token_ring")  # before enable_parallelism: see docs
        model = copy.deepcopy(base, dict(shared))
        model.enable_parallelism(
            config=ContextParallelConfig(ring_degree=ring, ulysses_degree=ulysses)
        )
        for backend in BACKENDS if ring > 1 else ["diffusers_ulysses"]:
            tokenring_xdit.set_ring_impl(BACKENDS.get(backend, "default"))
            row, latents = run(model, problem, args, device)
            row.update(errors(latents, reference), latents=latents)
            row.update(sent_bytes(problem, backend, ulysses, ring, elt))
            row["efficiency"] = ref_row["median_step_ms"] / (n * row["median_step_ms"])
            rows.append(dict(common, setting=label(ulysses, ring), backend=backend, **row))
            say(
                f"{problem.name}: {label(ulysses, ring)} {backend} "
                f"{row['median_step_ms']:.1f} ms/step, rel_l2 {row['rel_l2']:.2e}"
            )
        del model
    return rows


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", nargs="+", choices=sorted(MODELS), default=["wan", "flux"])
    ap.add_argument("--wan-size", choices=sorted(WAN_SIZES), default="1.3b")
    ap.add_argument("--flux-px", type=int, default=2048, help="image side (multiple of 16)")
    ap.add_argument("--layers", type=int, help="Wan blocks / Flux double blocks (single: 2x)")
    ap.add_argument("--steps", type=int, help="timed forwards per run (default 5; tiny 2)")
    ap.add_argument("--warmup", type=int, help="forwards before timing (default 2; tiny 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--settings", nargs="+", help="e.g. ring4 ulysses2xring2 (default: all)")
    ap.add_argument("--attention-backend", help="default _native_cudnn (GPU), _native_flash (CPU)")
    ap.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--tiny", action="store_true", help="tiny random configs (CPU test)")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    args.steps = args.steps or (2 if args.tiny else 5)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 2)
    if args.flux_px % 16:
        ap.error("--flux-px must be a multiple of 16 (8x VAE, 2x2 packing)")
    return args


def _set_up(args) -> torch.device:
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if not cuda:  # diffusers' CP on gloo: tokenring_xdit's opt-in CPU shims (docs/diffusers.md)
        from tokenring_xdit.patches import diffusers_cpu

        diffusers_cpu.enable()
    from diffusers.utils import logging as diffusers_logging

    import tokenring_xdit

    tokenring_xdit.install()  # the .pth does this when installed; covers PYTHONPATH runs
    diffusers_logging.set_verbosity_error()  # enable_parallelism's "experimental" line
    dist.init_process_group("nccl" if cuda else "gloo")
    if not cuda:
        args.attention_backend = args.attention_backend or "_native_flash"
        return torch.device("cpu")
    args.attention_backend = args.attention_backend or "_native_cudnn"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", dist.get_rank())))
    torch.cuda.set_device(device)
    return device


def _meta(args, device, n: int, argv: list[str]) -> dict:
    import diffusers

    meta = dict(
        ranks=n, device=str(device), torch=torch.__version__, diffusers=diffusers.__version__,
        python=platform.python_version(), attention_backend=args.attention_backend,
        steps=args.steps, warmup=args.warmup, layers=args.layers,
        loop="transformer alone, fixed flow-matching Euler steps (not the pipeline)",
        command=f"torchrun --nproc_per_node={n} -m benchmarks diffusers_cp {' '.join(argv)}",
    )  # fmt: skip
    env = sorted(os.environ.items())
    meta["env"] = {k: v for k, v in env if k.startswith(("NCCL_", "TOKENRING_XDIT_"))}
    if device.type == "cuda":
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
        meta.update(gpu=torch.cuda.get_device_name(), nccl=nccl)
    return meta


def main(argv=None) -> None:
    args = parse_args(argv)
    device = _set_up(args)
    n = dist.get_world_size()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = []
    for name in args.model:
        say(f"{name}: building on {n} ranks ({dtype})")
        problem = MODELS[name](args, device, dtype)
        say(f"{problem.name}: {problem.tokens} tokens, {problem.heads} heads, "
            f"{problem.attention_calls} CP attention calls per step")  # fmt: skip
        rows += bench_model(problem, args, device, n)
        del problem
        if device.type == "cuda":
            torch.cuda.empty_cache()
    meta = _meta(args, device, n, sys.argv[1:] if argv is None else argv)
    result = dict(
        meta=meta, verdicts=verdicts(rows), yardstick=yardstick(rows, n),
        rows=[{k: v for k, v in r.items() if k != "latents"} for r in rows],
    )  # fmt: skip
    if dist.get_rank() == 0:
        print(table(rows))
        for v in result["verdicts"]:
            print(f"{v['model']} {v['setting']}: {v['faster']} faster ({v['reason']})")
        for y in result["yardstick"]:
            got = f"max_abs {y['max_abs']:.2e}, rel_l2 {y['rel_l2']:.2e}"
            print(f"yardstick {y['model']} {y['between']}: {got}")
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(args.out, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
