"""CPU mode for xDiT: xfuser 0.7.0's own PixArt pipeline on gloo ranks, against plain diffusers.

Each world size is ONE launch (CI has 2 cores): every rank switches CPU mode on before importing
xfuser, builds the same tiny random PixArt-alpha pipeline (no download), wraps it with
xFuserPixArtAlphaPipeline and runs it; the last rank returns the latents, every rank its counts
of calls into xDiT's ring (`usp.ring_attn` and the torch ring it runs). The reference is plain
diffusers in the test process.
`disable()` is checked in a fresh interpreter against each module's namespace as xfuser built it.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.harness import run_ranks, values
from tests.speed import scaled


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("triton") is None,
        reason="CPU mode needs triton (pip install 'tokenring-xdit[cpu]')",
    ),
    # With a GPU, CPU mode calls straight through to xfuser: these tests would measure nothing.
    pytest.mark.skipif(_has_gpu(), reason="CPU mode tests run on a machine without a GPU"),
]

SIZE = 32  # pixels; the tiny VAE halves it, patch 2 -> 8 x 8 = 64 tokens
TEXT_LEN = 8
STEPS = 2
GUIDANCE = 4.5  # xfuser's PixArt wrapper needs classifier-free guidance
# Measured 6.7e-6 (latents up to ~15); faking the lse (zeros, as yunchang's TORCH_MATH does)
# gives 1.9e-2, so the bound separates a real merge from a wrong one.
FP32_TOL = 1e-4
LAYERS = 2


def _tiny_pipeline():
    """A random PixArt-alpha pipeline, identical in every process (seeded, CPU, fp32)."""
    import torch
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        PixArtAlphaPipeline,
        PixArtTransformer2DModel,
    )

    torch.manual_seed(0)
    transformer = PixArtTransformer2DModel(
        sample_size=SIZE // 2,
        num_layers=LAYERS,
        attention_head_dim=8,
        num_attention_heads=2,
        in_channels=4,
        out_channels=8,
        cross_attention_dim=16,
        caption_channels=32,
        patch_size=2,
        norm_type="ada_norm_single",
        use_additional_conditions=False,
    )
    vae = AutoencoderKL(
        block_out_channels=(8, 16),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        latent_channels=4,
        norm_num_groups=8,
        layers_per_block=1,
        sample_size=SIZE,
    )
    return PixArtAlphaPipeline(
        tokenizer=None,
        text_encoder=None,
        transformer=transformer.eval(),
        vae=vae.eval(),
        scheduler=DDIMScheduler(clip_sample=False),  # no clipping to hide an error
    )


def _inputs() -> dict:
    """Prompt embeddings (full masks: xDiT's processor ignores the cross-attention mask) and
    the starting latents."""
    import torch

    g = torch.Generator().manual_seed(1)
    ones = torch.ones(1, TEXT_LEN, dtype=torch.long)
    return dict(
        prompt=None,
        negative_prompt=None,
        prompt_embeds=torch.randn(1, TEXT_LEN, 32, generator=g),
        prompt_attention_mask=ones,
        negative_prompt_embeds=torch.randn(1, TEXT_LEN, 32, generator=g),
        negative_prompt_attention_mask=ones.clone(),
        latents=torch.randn(1, 4, SIZE // 2, SIZE // 2, generator=g),
        height=SIZE,
        width=SIZE,
        num_inference_steps=STEPS,
        guidance_scale=GUIDANCE,
        use_resolution_binning=False,
        output_type="latent",
    )


def _fingerprint(pipe) -> float:
    return float(sum(p.double().sum() for p in pipe.transformer.parameters()))


def _counting(fn, calls: dict, name: str):
    def counted(*args, **kwargs):
        calls[name] += 1
        return fn(*args, **kwargs)

    return counted


def _prepare_run_generators(input_config) -> dict:
    """Six pipelines' prepare_run hard-code a CUDA generator; run each against a stand-in
    pipeline (the runtime state they need exists now) and report what it was called with."""
    import importlib
    import types

    from tokenring_xdit.patches.table import CUDA_GENERATOR_PREPARE_RUNS

    seen = {}
    for module, (cls, _, _) in CUDA_GENERATOR_PREPARE_RUNS.items():
        pipeline_cls = getattr(importlib.import_module(module), cls)
        call: dict = {}
        stand_in = types.SimpleNamespace(__call__=call.update)  # records the call's kwargs
        pipeline_cls.prepare_run(stand_in, input_config)
        seen[cls] = dict(
            generator=call.pop("generator").device.type,
            steps=call.pop("num_inference_steps"),
            extra=sorted(set(call) - {"height", "width", "prompt", "output_type"}),
        )
    return seen


def _xdit_rank(rank: int, world_size: int, ulysses: int, ring: int) -> dict:
    """One rank: CPU mode, then xfuser, then xDiT's PixArt pipeline at ulysses x ring."""
    from tokenring_xdit.patches import xfuser_cpu

    assert "xfuser" not in sys.modules
    armed = xfuser_cpu.enable()
    import torch
    import xfuser.model_executor.layers.usp as usp
    from xfuser import xFuserArgs, xFuserPixArtAlphaPipeline
    from xfuser.core.distributed import get_runtime_state, init_distributed_environment

    # USP looks both names up at call time: ring_attn is its ring entry point (whatever wraps
    # it), _templated_ring_attention the torch ring that xDiT's own ring_attn runs.
    calls = {"ring_attn": 0, "_templated_ring_attention": 0}
    for name in calls:
        setattr(usp, name, _counting(getattr(usp, name), calls, name))
    # The harness already called init_process_group; xfuser then only builds its world group.
    init_distributed_environment(rank=rank, world_size=world_size, local_rank=rank)
    pipe = _tiny_pipeline()
    fingerprint = _fingerprint(pipe)
    engine_config, input_config = xFuserArgs(
        model="tiny-random-pixart-alpha",  # never loaded: the pipeline is built in memory
        ulysses_degree=ulysses,
        ring_degree=ring,
        height=SIZE,
        width=SIZE,
        num_inference_steps=STEPS,
        output_type="latent",
        no_use_resolution_binning=True,
    ).create_config()
    xpipe = xFuserPixArtAlphaPipeline(pipe, engine_config)
    with torch.no_grad():
        out = xpipe(**_inputs())
    latents = out.images if out is not None else None
    return dict(
        prepare_run=_prepare_run_generators(input_config),
        armed=armed,
        applied=xfuser_cpu.applied_patches(),
        backend=get_runtime_state().attention_backend.name,
        calls=calls,
        fingerprint=fingerprint,
        # numpy, not a tensor: a tensor crosses the queue as a shared-memory handle that dies
        # with the rank process
        latents=None if latents is None else latents.numpy().copy(),
    )


@functools.cache
def _reference():
    """Plain diffusers, one process, same weights and latents."""
    import torch

    pipe = _tiny_pipeline()
    with torch.no_grad():
        return _fingerprint(pipe), pipe(**_inputs()).images


@functools.cache
def _launch(ulysses: int, ring: int) -> list[dict]:
    return values(run_ranks(_xdit_rank, ulysses * ring, ulysses, ring, timeout=240))


# xDiT wraps the self-attention of every block (cross-attention stays diffusers'); the CFG
# batch goes through together: one ring call per block per step.
EXPECTED_RING_CALLS = LAYERS * STEPS


@pytest.mark.parametrize("ulysses,ring", [(1, 2), (2, 2)], ids=["ring2", "ulysses2xring2"])
def test_pixart_matches_diffusers(ulysses: int, ring: int) -> None:
    results = _launch(ulysses, ring)
    fingerprint, expected = _reference()
    for r in results:
        assert r["fingerprint"] == fingerprint  # same random weights in every process
        assert r["backend"] == "SDPA_FLASH"
        assert "xfuser_cpu.sdpa_flash_cpu" in r["applied"]
        # xDiT's ring path was taken, on every rank, for every attention call
        assert r["calls"] == dict.fromkeys(r["calls"], EXPECTED_RING_CALLS), r["calls"]
    import torch

    msl, control = ["max_sequence_length"], ["control_image", "max_sequence_length"]
    assert results[0]["prepare_run"] == {
        "xFuserFluxPipeline": dict(generator="cpu", steps=3, extra=msl),
        "xFuserFlux2PipelineBase": dict(generator="cpu", steps=3, extra=msl),
        "xFuserPipelineFluxControlPipeline": dict(generator="cpu", steps=3, extra=control),
        "xFuserSanaPipeline": dict(generator="cpu", steps=3, extra=[]),
        "xFuserSanaSprintPipeline": dict(generator="cpu", steps=2, extra=[]),
        "xFuserStableDiffusion3Pipeline": dict(generator="cpu", steps=3, extra=[]),
    }
    got = results[-1]["latents"]  # only the last rank gets the output
    assert got is not None and got.shape == tuple(expected.shape)
    got = torch.from_numpy(got)
    diff = (got - expected).abs().max().item()
    print(f"ulysses={ulysses} ring={ring}: max |xDiT - diffusers| = {diff:.3e}")
    assert diff < FP32_TOL


DISABLE_SCRIPT = textwrap.dedent(
    """
    import json, sys, wrapt
    from tokenring_xdit.patches import xfuser_cpu

    # Registered before enable(), so each runs first: the namespace exactly as xfuser built it.
    pristine = {}
    def snapshot(mod):
        pristine[mod.__name__] = dict(vars(mod))
    for name in xfuser_cpu.hooked_modules():
        wrapt.register_post_import_hook(snapshot, name)

    first = xfuser_cpu.enable()
    assert xfuser_cpu.enable() == first  # idempotent: nothing wrapped twice
    import xfuser  # noqa: F401
    import xfuser.core.distributed.attention_backend as ab
    import xfuser.core.distributed.runtime_state as rs
    import xfuser.envs as envs
    import xfuser.model_executor.layers.usp as usp
    import xfuser.model_executor.pipelines.base_pipeline as bp

    registry = dict(ab.ATTENTION_FUNCTION_REGISTRY)
    select = vars(rs.RuntimeState)["_select_attention_backend"]
    pristine_select = select.__wrapped__
    pristine_registry = dict(registry)
    pristine_registry[ab.AttentionBackendType.SDPA_FLASH] = registry[
        ab.AttentionBackendType.SDPA_FLASH].__wrapped__

    report = {"first": first, "applied": xfuser_cpu.applied_patches()}
    report["patched"] = dict(
        device_version=envs.get_device_version(), backend=envs.get_torch_distributed_backend(),
        usp_pg=usp.PROCESS_GROUP is not None, alias=bp.get_device is not envs.__dict__[
            "get_device"].__wrapped__,
    )
    xfuser_cpu.disable()
    xfuser_cpu.disable()  # idempotent
    changed = []
    for name, before in pristine.items():
        now = vars(sys.modules[name])
        for key in set(before) | set(now):
            was, is_ = before.get(key, "<missing>"), now.get(key, "<missing>")
            # an alias taken while an envs function was wrapped is back to the original
            if was is not is_ and getattr(was, "__wrapped__", None) is not is_:
                changed.append(f"{name}:{key}")
    if dict(ab.ATTENTION_FUNCTION_REGISTRY) != pristine_registry or any(
        ab.ATTENTION_FUNCTION_REGISTRY[k] is not v for k, v in pristine_registry.items()
    ):
        changed.append("ATTENTION_FUNCTION_REGISTRY")
    if vars(rs.RuntimeState)["_select_attention_backend"] is not pristine_select:
        changed.append("RuntimeState._select_attention_backend")
    # aliases taken with `from xfuser.envs import ...` point at the originals again
    for mod in (bp,):
        for key in ("get_device", "get_device_name"):
            if vars(mod)[key] is not vars(envs)[key]:
                changed.append(f"alias {mod.__name__}:{key}")
    report["changed"] = changed
    report["applied_after"] = xfuser_cpu.applied_patches()
    # xfuser's own answer is back: it raises with a CPU build of torch; a CUDA build without a
    # GPU has it return the build's CUDA version (torch.version.cuda)
    import torch
    try:
        report["own_again"] = envs.get_device_version() == torch.version.cuda is not None
    except NotImplementedError:
        report["own_again"] = torch.version.cuda is None
    # and back on: patches go in again on the imported modules
    report["again"] = xfuser_cpu.enable() == first and envs.get_device_version() is None
    xfuser_cpu.disable()
    print(json.dumps(report))
    """
)


def test_disable_restores_every_symbol() -> None:
    # Only CPU mode's changes: the project's own TokenRing patches (armed by the .pth) stay off.
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENRING_XDIT_AUTOPATCH="0")
    proc = subprocess.run(
        [sys.executable, "-c", DISABLE_SCRIPT],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["patched"] == dict(device_version=None, backend="gloo", usp_pg=True, alias=True)
    assert report["applied"] == report["first"]
    assert report["changed"] == []
    assert report["applied_after"] == []
    assert report["own_again"]  # xfuser's own behaviour is back
    assert report["again"]


def test_pending_hooks_do_nothing_after_disable() -> None:
    """enable(); disable(); import xfuser -> xfuser's own behaviour, untouched: its CPU failure
    with a CPU build of torch; with a CUDA build on this GPU-less machine the import succeeds and
    get_device_version answers the build's CUDA version."""
    script = textwrap.dedent(
        """
        import json, torch
        from tokenring_xdit.patches import xfuser_cpu
        xfuser_cpu.enable(); xfuser_cpu.disable()
        report = {"cuda_build": torch.version.cuda}
        try:
            import xfuser.envs as envs
        except NotImplementedError as exc:
            report["error"] = str(exc)
        else:
            report["wrapped"] = hasattr(envs.get_device_version, "__wrapped__")
            report["applied"] = xfuser_cpu.applied_patches()
            report["version"] = envs.get_device_version()
        print(json.dumps(report))
        """
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENRING_XDIT_AUTOPATCH="0")
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=scaled(120), env=env
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    if report["cuda_build"] is None:
        assert report["error"].startswith("No Accelerators"), report
    else:
        assert report == dict(
            cuda_build=report["cuda_build"],
            wrapped=False,
            applied=[],
            version=report["cuda_build"],
        )


def test_sdpa_flash_cpu_returns_a_real_lse() -> None:
    import torch

    from tokenring_xdit.patches.xfuser_cpu import sdpa_flash_cpu

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 16, generator=g) for n in (5, 7, 7))
    out, lse = sdpa_flash_cpu(q, k, v, 0.0, False)
    scores = (q.double() @ k.double().transpose(-1, -2)) / 16**0.5
    assert lse.dtype == torch.float32 and lse.shape == (2, 3, 5)
    torch.testing.assert_close(lse.double(), scores.logsumexp(-1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.double(), scores.softmax(-1) @ v.double(), atol=1e-5, rtol=1e-5)


def test_prepare_run_wrapper_binds_self_either_way(monkeypatch) -> None:
    """Called on an instance or through the class, the CPU warm-up gets the same arguments."""
    import wrapt

    from tokenring_xdit.patches import xfuser_cpu

    class Pipeline:
        def prepare_run(self, input_config, steps: int = 3, sync_steps: int = 1):
            raise AssertionError("the CUDA-generator body must not run on CPU")

    wrapt.wrap_function_wrapper(Pipeline, "prepare_run", xfuser_cpu._prepare_run(False, False))
    seen = []
    monkeypatch.setattr(xfuser_cpu, "_cpu_prepare_run", lambda *a: seen.append(a))
    pipe, config = Pipeline(), object()
    pipe.prepare_run(config, steps=5)
    Pipeline.prepare_run(pipe, config, 5)
    assert seen == [(pipe, config, 5, 1, {})] * 2


def test_enable_names_the_missing_triton(monkeypatch) -> None:
    from tokenring_xdit.patches import xfuser_cpu

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a)
    )
    with pytest.raises(ImportError, match=r"tokenring-xdit\[cpu\]"):
        xfuser_cpu.enable()
    assert not xfuser_cpu.is_enabled()


def _module_level_lines(module_file: str) -> list[str]:
    with open(module_file) as f:
        return [line.rstrip() for line in f if line[:1] not in (" ", "\t")]


def test_patch_lists_match_installed_xfuser() -> None:
    """The modules that freeze HAS_LONG_CTX_ATTN / gate PROCESS_GROUP at import, read from the
    installed xfuser's source (without importing it), are exactly the ones CPU mode patches."""
    from tokenring_xdit.patches import table

    root = importlib.util.find_spec("xfuser").submodule_search_locations[0]
    long_ctx, process_group = set(), set()
    for folder, _, files in os.walk(root):
        for file in files:
            if not file.endswith(".py"):
                continue
            path = os.path.join(folder, file)
            name = os.path.relpath(path, os.path.dirname(root))[:-3].replace(os.sep, ".")
            lines = _module_level_lines(path)
            if 'HAS_LONG_CTX_ATTN = env_info["has_long_ctx_attn"]' in lines:
                long_ctx.add(name)
            if "PROCESS_GROUP = None" in {line.strip() for line in open(path)}:
                process_group.add(name)
    process_group.discard("xfuser.model_executor.layers.usp_legacy")  # torch < 2.5 only
    assert long_ctx == set(table.LONG_CTX_MODULES)
    assert process_group == set(table.PROCESS_GROUP_MODULES)


SELECT_SCRIPT = textwrap.dedent(
    """
    import json, types, torch
    from tokenring_xdit.patches import xfuser_cpu
    xfuser_cpu.enable()
    import xfuser.core.distributed.runtime_state as rs

    def config(backend):
        runtime = types.SimpleNamespace(attention_backend=backend)
        parallel = types.SimpleNamespace(pp_degree=1)  # read by the PipeFusion refusal
        return types.SimpleNamespace(runtime_config=runtime, parallel_config=parallel)

    picks = {}
    # what xfuser's choice reads from the build: a CPU build has no cuDNN, a CUDA build on a
    # GPU-less machine has it (torch.cuda.is_available() stays False in both: no device)
    for cudnn in (False, True):
        torch.backends.cudnn.is_available = lambda cudnn=cudnn: cudnn
        select = rs.RuntimeState.__new__(rs.RuntimeState)._select_attention_backend
        picks[str(cudnn)] = [select(config(None)).name, select(config("sdpa")).name]
    print(json.dumps(picks))
    """
)


def test_automatic_backend_on_cpu_whatever_the_build() -> None:
    """On CPU the automatic choice is SDPA_FLASH (the kernel with an lse that runs there), also
    where xfuser's choice would be CUDNN because the build of torch has cuDNN; an explicit
    --attention_backend is kept. The CUDA build's answer is simulated here (one build on this
    machine); scripts/cuda-build-check.sh runs the suite under a real one."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENRING_XDIT_AUTOPATCH="0")
    proc = subprocess.run(
        [sys.executable, "-c", SELECT_SCRIPT],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    picks = json.loads(proc.stdout.strip().splitlines()[-1])
    assert picks == {"False": ["SDPA_FLASH", "SDPA"], "True": ["SDPA_FLASH", "SDPA"]}


def test_pipefusion_is_refused_up_front_on_cpu() -> None:
    """PipeFusion would wait until killed in CPU mode: building the pipeline's runtime state
    (the first call that sees the parallel config) refuses it, naming the fix."""
    code = """
from tokenring_xdit.patches import xfuser_cpu
xfuser_cpu.enable()
from xfuser.config.config import (DataParallelConfig, FullyShardConfig, ParallelConfig,
    PipeFusionParallelConfig, RuntimeConfig, SequenceParallelConfig, TensorParallelConfig,
    VaeParallelConfig)
from xfuser.core.distributed.runtime_state import RuntimeState
pp = PipeFusionParallelConfig(pp_degree=2, attn_layer_num_for_pp=None, dit_parallel_size=2)
parallel = ParallelConfig(DataParallelConfig(), SequenceParallelConfig(), pp,
    TensorParallelConfig(),
    FullyShardConfig(), VaeParallelConfig(), world_size=2, dit_parallel_size=2)
class Engine:  # the two fields RuntimeState._select_attention_backend reads
    parallel_config, runtime_config = parallel, RuntimeConfig()
try:
    RuntimeState.__new__(RuntimeState)._select_attention_backend(Engine())  # as __init__ does
    print("no error")
except NotImplementedError as exc:
    print("refused:", exc)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=scaled(120)
    )
    assert "refused: --pipefusion_parallel_degree 2: PipeFusion does not run" in done.stdout, (
        done.stdout[-2000:] + done.stderr[-2000:]
    )
    assert "--pipefusion_parallel_degree 1" in done.stdout, done.stdout
