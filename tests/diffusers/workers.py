"""Rank functions for the diffusers tests (module level: spawn pickles them by reference).

Every rank builds the same seeded tiny model twice: a plain one (one process, diffusers' default
backend: SDPA on the full sequence) and one under diffusers' own `enable_parallelism`. The CP
model runs on the '_native_flash' backend (its forward op returns an lse; on CPU through
tokenring_xdit's opt-in CPU shims) with diffusers' ring, then with TokenRing. CP models gather
their output on every rank, so every rank compares the full output.
"""

from __future__ import annotations

import logging

import torch

from tokenring_xdit.hosts.selection import RING_IMPL_ENV

# TokenRing chosen through the environment (every worker inherits it) before enable_parallelism;
# automatic patching off, so the workers can record diffusers' originals before install().
ENV = {RING_IMPL_ENV: "token_ring", "TOKENRING_XDIT_AUTOPATCH": "0"}
BACKEND = "_native_flash"


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def set_up() -> tuple[dict, _Lines]:
    """CPU shims + TokenRing patches; returns diffusers' original objects and the log lines."""
    import diffusers.models._modeling_parallel as modeling_parallel
    import diffusers.models.attention_dispatch as attention_dispatch

    originals = {
        "cp": attention_dispatch._templated_context_parallel_attention,
        "setup": modeling_parallel.ContextParallelConfig.__dict__["setup"],
    }
    from tokenring_xdit.patches import diffusers_cpu

    diffusers_cpu.enable()
    import tokenring_xdit

    tokenring_xdit.install()
    lines = _Lines()
    logger = logging.getLogger("diffusers.tokenring_xdit")
    logger.setLevel(logging.INFO)
    logger.addHandler(lines)
    return originals, lines


def flux_model():
    from diffusers import FluxTransformer2DModel

    from tokenring_xdit.tools.pipelines import FLUX_TINY

    torch.manual_seed(0)
    return FluxTransformer2DModel(**FLUX_TINY).eval()


def flux_inputs(s_img: int, s_txt: int) -> dict:
    gen = torch.Generator().manual_seed(1)
    return dict(
        hidden_states=torch.randn(1, s_img, 16, generator=gen),
        encoder_hidden_states=torch.randn(1, s_txt, 32, generator=gen),
        pooled_projections=torch.randn(1, 16, generator=gen),
        timestep=torch.tensor([0.5]),
        guidance=torch.tensor([3.5]),
        img_ids=torch.randint(0, 8, (s_img, 3), generator=gen).float(),
        txt_ids=torch.zeros(s_txt, 3),
        return_dict=False,
    )


def wan_model():
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=4,
        out_channels=4,
        text_dim=16,
        freq_dim=32,
        ffn_dim=32,
        num_layers=1,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    ).eval()


def wan_inputs() -> dict:
    gen = torch.Generator().manual_seed(1)
    return dict(
        hidden_states=torch.randn(1, 4, 2, 8, 8, generator=gen),  # 2 x 4 x 4 = 32 tokens
        encoder_hidden_states=torch.randn(1, 12, 16, generator=gen),
        timestep=torch.tensor([500]),
        return_dict=False,
    )


def _calls() -> int:
    import tokenring_xdit

    return tokenring_xdit.calls_by_host().get("diffusers", 0)


def compare(build, inputs: dict, config) -> dict:
    """Max |err| of diffusers' ring and TokenRing against one process, and TokenRing's calls."""
    from tokenring_xdit.hosts import selection

    with torch.no_grad():
        reference = build()(**inputs)[0]
        model = build()
        model.set_attention_backend(BACKEND)
        model.enable_parallelism(config=config)
        selection.set_xdit_ring_impl("default")
        before = _calls()
        theirs = model(**inputs)[0]
        their_calls = _calls() - before
        selection.set_xdit_ring_impl("token_ring")
        ours = model(**inputs)[0]
        our_calls = _calls() - before
    return dict(
        token_ring=(ours - reference).abs().max().item(),
        diffusers_ring=(theirs - reference).abs().max().item(),
        token_ring_vs_diffusers=(ours - theirs).abs().max().item(),
        calls=our_calls,
        calls_with_diffusers_ring=their_calls,
        model=model,
    )


def _expect_error(model, inputs: dict, grad: bool) -> str:
    try:
        with torch.set_grad_enabled(grad):
            model(**inputs)
    except NotImplementedError as exc:
        return str(exc)
    return "no error"


def _late_selection(inputs: dict) -> dict:
    """TokenRing selected only after enable_parallelism (no communicators made at set-up):
    the first ring call makes them, and the output equals diffusers' ring."""
    from diffusers import ContextParallelConfig

    from tokenring_xdit.hosts import selection

    selection.set_xdit_ring_impl("default")
    model = flux_model()
    model.set_attention_backend(BACKEND)
    model.enable_parallelism(config=ContextParallelConfig(ring_degree=2))
    with torch.no_grad():
        theirs = model(**inputs)[0]
    selection.set_xdit_ring_impl("token_ring")
    calls = _calls()
    with torch.no_grad():
        ours = model(**inputs)[0]
    return {"max_err": (ours - theirs).abs().max().item(), "calls": _calls() - calls}


def _mismatch(model, inputs: dict, rank: int) -> dict:
    """Ranks that chose different rings (a Python switch on one rank; `auto` with gradients on
    one rank only): one ValueError on every rank before either ring moves anything, and the
    model runs normally afterwards."""
    from tokenring_xdit.hosts import selection

    def attempt(grad: bool) -> str:
        try:
            with torch.set_grad_enabled(grad):
                model(**inputs)
        except ValueError as exc:
            return str(exc)
        return "no error"

    selection.set_xdit_ring_impl("token_ring" if rank == 0 else "default")
    switch = attempt(grad=False)
    selection.set_xdit_ring_impl("auto")
    grads = attempt(grad=rank == 0)
    selection.set_xdit_ring_impl("token_ring")
    with torch.no_grad():
        after = model(**inputs)[0]
    return {"switch": switch, "auto_grad": grads, "after_finite": bool(after.isfinite().all())}


def _grad_check(inputs: dict) -> dict:
    """Training through diffusers' ring with TokenRing: the loss and the parameter gradients
    (summed over ranks: each rank's layers saw its own tokens) equal one process's."""
    import torch.distributed as dist
    from diffusers import ContextParallelConfig

    from tokenring_xdit.hosts import selection

    def loss_and_grads(model):
        model.zero_grad()
        out = model(**inputs)[0]
        loss = out.double().pow(2).mean()
        loss.backward()
        return loss.item(), {n: p.grad.double().clone() for n, p in model.named_parameters()}

    ref_loss, ref_grads = loss_and_grads(flux_model())
    model = flux_model()
    model.set_attention_backend(BACKEND)
    model.enable_parallelism(config=ContextParallelConfig(ring_degree=2))
    selection.set_xdit_ring_impl("token_ring")
    before = _calls()
    loss, grads = loss_and_grads(model)
    calls = _calls() - before
    worst = 0.0
    for name, g in grads.items():
        dist.all_reduce(g)
        scale = ref_grads[name].abs().max().clamp_min(1e-6)
        worst = max(worst, ((g - ref_grads[name]).abs().max() / scale).item())
    return {"loss_err": abs(loss - ref_loss), "grad_rel_err": worst, "calls": calls}


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = (a.double() - b.double()).pow(2).mean().item()
    return float("inf") if mse == 0 else 10.0 * torch.log10(torch.tensor(1.0 / mse)).item()


def _image(pipe_built, cp_config=None):
    pipe = pipe_built.pipe
    if cp_config is not None:
        pipe.transformer.set_attention_backend(BACKEND)
        pipe.transformer.enable_parallelism(config=cp_config)
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        return pipe(
            height=pipe_built.height,
            width=pipe_built.width,
            num_inference_steps=2,
            guidance_scale=3.5,
            output_type="pt",
            generator=torch.Generator().manual_seed(0),
            **pipe_built.call_kwargs,
        ).images


def ring2(rank: int, world_size: int) -> dict:
    """Flux and Wan at ring 2, the tiny Flux pipeline, both refusals, the log, `auto` with
    uneven shards, uninstall."""
    import diffusers.models._modeling_parallel as modeling_parallel
    import diffusers.models.attention_dispatch as attention_dispatch
    from diffusers import ContextParallelConfig

    import tokenring_xdit
    from tokenring_xdit.hosts import selection
    from tokenring_xdit.tools import pipelines

    originals, lines = set_up()
    inputs = flux_inputs(24, 12)
    # first, while no ring group has a return communicator yet (a ring spanning the world
    # reuses the world group, so any earlier TokenRing set-up would have covered it)
    out = {"late_selection": _late_selection(inputs)}
    flux = compare(flux_model, inputs, ContextParallelConfig(ring_degree=2))
    model = flux.pop("model")
    out["flux"] = flux
    out["mismatch"] = _mismatch(model, inputs, rank)
    wan = compare(wan_model, wan_inputs(), ContextParallelConfig(ring_degree=2))
    wan.pop("model")
    out["wan"] = wan

    # refusals, raised on every rank before the ring posts anything
    out["grads"] = _grad_check(inputs)
    selection.set_xdit_ring_impl("default")  # diffusers' own ring: no CPU backward
    out["their_ring_grad_error"] = _expect_error(model, inputs, grad=True)
    selection.set_xdit_ring_impl("token_ring")
    model.set_attention_backend("native")
    out["no_lse_error"] = _expect_error(model, inputs, grad=False)
    model.set_attention_backend(BACKEND)

    reference = _image(pipelines.flux("tiny", seed=0))
    before = _calls()
    ours = _image(pipelines.flux("tiny", seed=0), ContextParallelConfig(ring_degree=2))
    out["pipeline"] = dict(psnr_db=_psnr(ours, reference), calls=_calls() - before)
    auto_from = len(lines.lines)
    out["auto_ring_anything"] = _auto_ring_anything(lines)  # in this launch: one launch less
    auto_to = len(lines.lines)

    # uninstall: diffusers exactly as it was, and its own ring runs (TokenRing stays selected)
    with torch.no_grad():
        selection.set_xdit_ring_impl("default")
        theirs = model(**inputs)[0]
        selection.set_xdit_ring_impl("token_ring")
        tokenring_xdit.uninstall()  # every row, the CPU shims included
        restored = (
            attention_dispatch._templated_context_parallel_attention is originals["cp"]
            and modeling_parallel.ContextParallelConfig.__dict__["setup"] is originals["setup"]
        )
        installed = tokenring_xdit.installed_patches()
        from tokenring_xdit.patches import diffusers_cpu

        diffusers_cpu.enable()  # diffusers' ring needs the CPU shims again to run on gloo
        before = _calls()
        after_uninstall = model(**inputs)[0]
    out["uninstall"] = dict(
        calls=_calls() - before,
        same_as_diffusers_ring=torch.equal(after_uninstall, theirs),
        restored=restored,
        installed=installed,
    )
    out["log"] = lines.lines[:auto_from] + lines.lines[auto_to:]  # all but `auto`'s (its own)
    return out


def ring3(rank: int, world_size: int) -> dict:
    """Flux at ring 3: even lengths, and uneven ones through diffusers' ring_anything."""
    from diffusers import ContextParallelConfig

    set_up()
    even = compare(flux_model, flux_inputs(24, 12), ContextParallelConfig(ring_degree=3))
    uneven = compare(
        flux_model, flux_inputs(25, 11), ContextParallelConfig(ring_degree=3, ring_anything=True)
    )
    even.pop("model")
    # Lengths 13/12/11 before, 12/12/12 now: rank 1's shard keeps its length while the others'
    # change, so TokenRing must not reuse a cached shape handshake on rank 1 alone (a hang).
    inputs = flux_inputs(24, 12)
    before = _calls()
    with torch.no_grad():
        again = uneven.pop("model")(**inputs)[0]
        uneven["new_lengths"] = (again - flux_model()(**inputs)[0]).abs().max().item()
    uneven["new_lengths_calls"] = _calls() - before
    return dict(even=even, ring_anything=uneven)


def ulysses2_ring2(rank: int, world_size: int) -> dict:
    """Flux at ulysses 2 x ring 2 (diffusers' unified path; 4 heads, 2 per ulysses rank)."""
    from diffusers import ContextParallelConfig

    set_up()
    result = compare(
        flux_model, flux_inputs(24, 12), ContextParallelConfig(ring_degree=2, ulysses_degree=2)
    )
    result.pop("model")
    return result


def single(rank: int, world_size: int) -> dict:
    """One fresh process: lazy arming, patch ids vs the table, the block kernel, exact undo."""
    import sys

    from tokenring_xdit.patches import HOOKS, PATCH_TABLE, _arm, diffusers_cpu
    from tokenring_xdit.patches import diffusers as patch_set

    # what the .pth bootstrap does with the `diffusers` entry point
    _arm("diffusers", HOOKS["diffusers"][1])
    import diffusers  # noqa: F401

    out = {"lazy": "diffusers.models.attention_dispatch" not in sys.modules}
    out["active_after_import_diffusers"] = patch_set.PATCHES.active
    import diffusers.hooks.context_parallel as context_parallel
    import diffusers.models._modeling_parallel as modeling_parallel
    import diffusers.models.attention_dispatch as attention_dispatch
    import diffusers.models.modeling_utils as modeling_utils

    out["applied"] = list(patch_set.PATCHES.applied)
    targets = {
        "cp": (attention_dispatch, "_templated_context_parallel_attention"),
        "flash_fwd": (attention_dispatch, "_native_flash_attention_forward_op"),
        "flash_bwd": (attention_dispatch, "_native_flash_attention_backward_op"),
        "gather": (context_parallel, "_all_gather_anything"),
        "sizes": (modeling_parallel, "gather_size_by_comm"),
        "sizes_dispatch": (attention_dispatch, "gather_size_by_comm"),
        "sizes_hooks": (context_parallel, "gather_size_by_comm"),
    }
    originals = {name: getattr(*where) for name, where in targets.items()}
    originals["setup"] = modeling_parallel.ContextParallelConfig.__dict__["setup"]
    originals["resolve"] = modeling_utils.ModelMixin.__dict__["_resolve_parallel_config"]
    originals["cp"] = originals["cp"].__wrapped__  # patched already, by the armed hook
    out["cpu_applied"] = diffusers_cpu.enable()
    # the shim reaches the names diffusers imported before it was applied
    out["sizes_aliased"] = (
        attention_dispatch.gather_size_by_comm
        is modeling_parallel.gather_size_by_comm
        is context_parallel.gather_size_by_comm
        is not originals["sizes"]
    )
    out["table"] = [p.id for p in PATCH_TABLE if p.host == "diffusers"]

    # the block kernel: diffusers' own forward op (CPU flash through the shim) vs exact math
    from tokenring_xdit.hosts import diffusers as host
    from tokenring_xdit.ring.kernels import math as exact
    from tokenring_xdit.ring.tensor_layout import BSHD

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 7, 3, 16, generator=gen) for _ in range(3))
    kernel = host.block_kernel(attention_dispatch._native_flash_attention_forward_op, None)
    got, want = kernel(q, k, v, 0.25, BSHD), exact(q, k, v, 0.25, BSHD)
    out["kernel_err"] = max((a - b).abs().max().item() for a, b in zip(got, want, strict=True))
    out["lse_shape"] = tuple(got[1].shape)
    try:
        host._require_lse(attention_dispatch._native_attention_forward_op, None, q, k, v, None)
        out["no_lse"] = "no error"
    except NotImplementedError as exc:
        out["no_lse"] = str(exc)

    out["ring_degree_one"] = ring_degree_one("cpu", torch.float32, ["_native_flash", "native"])
    import tokenring_xdit

    tokenring_xdit.uninstall()
    diffusers_cpu.disable()
    restored = {name: getattr(*where) is originals[name] for name, where in targets.items()}
    restored["setup"] = modeling_parallel.ContextParallelConfig.__dict__["setup"] is (
        originals["setup"].__wrapped__
    )
    restored["resolve"] = (
        modeling_utils.ModelMixin.__dict__["_resolve_parallel_config"] is (originals["resolve"])
    )
    out["restored"] = restored
    return out


def ring_degree_one(device: str, dtype: torch.dtype, backends: list[str]) -> dict:
    """The patched path's body (hosts.diffusers.context_parallel_attention) on a ring of one rank
    (needs a 1-rank process group): each backend's own forward op as TokenRing's block kernel,
    against exact fp32 attention. Per backend: errors, lse shape, calls, or the refusal."""
    import functools

    import diffusers.models.attention_dispatch as ad
    from diffusers import ContextParallelConfig
    from diffusers.models._modeling_parallel import ParallelConfig
    from torch.distributed.device_mesh import init_device_mesh

    from tokenring_xdit.hosts import diffusers as host
    from tokenring_xdit.ring.kernels import math as exact
    from tokenring_xdit.ring.tensor_layout import BSHD

    cp = ContextParallelConfig(ring_degree=2)
    cp.ring_degree = 1  # diffusers' config refuses one rank; TokenRing takes a ring of one
    config = ParallelConfig(context_parallel_config=cp)
    mesh = init_device_mesh(device, (1, 1), mesh_dim_names=("ring", "ulysses"))
    config.setup(0, 1, torch.device(device), mesh=mesh)
    ops = {
        "_native_cudnn": ad._cudnn_attention_forward_op,
        "_native_flash": ad._native_flash_attention_forward_op,
        "flash": functools.partial(ad._flash_attention_forward_op, window_size=(-1, -1)),
        "native": ad._native_attention_forward_op,
    }
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 300, 4, 64, generator=gen).to(device, dtype) for _ in range(3))
    want_out, want_lse = exact(*(x.float() for x in (q, k, v)), 64**-0.5, BSHD)
    results = {}
    for name in backends:
        before = _calls()
        try:
            with torch.no_grad():
                out, lse = host.context_parallel_attention(
                    q, k, v, None, 0.0, None, True, ops[name], config
                )
        except NotImplementedError as exc:
            results[name] = dict(error=str(exc))
            continue
        results[name] = dict(
            out_err=(out.float() - want_out).abs().max().item(),
            lse_err=(lse.transpose(1, 2) - want_lse).abs().max().item(),
            lse_shape=tuple(lse.shape),
            dtype=str(out.dtype),
            calls=_calls() - before,
        )
    return results


def _auto_ring_anything(lines: _Lines) -> dict:
    """`auto` under diffusers with uneven shards (ring_anything, 19/18 tokens): the ranks agree
    on one signature (the longest shard), TokenRing runs (CPU rule), rank 0 logs it once (the
    lines logged here: `lines` holds what came before)."""
    from diffusers import ContextParallelConfig

    from tokenring_xdit.hosts import selection

    logged = len(lines.lines)
    inputs = flux_inputs(25, 12)
    with torch.no_grad():
        reference = flux_model()(**inputs)[0]
        model = flux_model()
        model.set_attention_backend(BACKEND)
        model.enable_parallelism(config=ContextParallelConfig(ring_degree=2, ring_anything=True))
        selection.set_xdit_ring_impl("auto")
        before = _calls()
        out = model(**inputs)[0]
        out = model(**inputs)[0]  # same signatures again: no new decision, no new line
    return dict(
        max_err=(out - reference).abs().max().item(),
        calls=_calls() - before,
        log=lines.lines[logged:],
    )
