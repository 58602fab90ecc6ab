"""CPU mode for xDiT: run xfuser 0.7.0's own pipelines on CPU with torch.distributed gloo.

Opt-in, for development and CI; it changes nothing on a machine with an accelerator except where
noted in its rows of the patch table (switch "CPU mode"). xfuser decides much at import time
(module-level code), so `enable()` must run BEFORE `xfuser` is imported: it arms wrapt post-import
hooks, one per xfuser module it fixes, and each hook patches its module right after the module body
has run, before any dependent module imports from it. `disable()` puts back every original object,
including the aliases other modules took with `from ... import`. No installed file is edited and
`torch.cuda.is_available` is never touched. See docs/cpu-mode.md.

    from tokenring_xdit.patches import xfuser_cpu
    xfuser_cpu.enable()            # before the first `import xfuser`
    import xfuser
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
import wrapt

from .base import PatchSet, check_host_version
from .table import (
    COORDINATOR,
    CPU_MODE,
    CUDA_GENERATOR_PREPARE_RUNS,
    LONG_CTX_MODULES,
    PATCH_TABLE,
    PROCESS_GROUP_MODULES,
    XFUSER_CPU_VERSIONS,
    YUNCHANG_GATED,
    PatchPoint,
)

__all__ = [
    "CPU_PATCHES",
    "XFUSER_VERSIONS",
    "applied_patches",
    "disable",
    "enable",
    "hooked_modules",
    "is_enabled",
    "sdpa_flash_cpu",
]

XFUSER_VERSIONS = XFUSER_CPU_VERSIONS
# This mode's rows of the one patch table.
CPU_PATCHES: tuple[PatchPoint, ...] = tuple(
    p for p in PATCH_TABLE if p.switch == CPU_MODE and p.host == "xfuser"
)
_ENVS = "xfuser.envs"


# ------------------------------------------------------------------------------------------
# What CPU mode runs instead.


def _on_cpu() -> bool:
    """True when xDiT would otherwise find no device: no CUDA/ROCm GPU, no NPU, MUSA or MPS.

    Decided by the devices present, not by the build: a CUDA build of torch on a machine without
    a GPU answers False to torch.cuda.is_available() (no device) and is on CPU here."""
    if torch.cuda.is_available():
        return False
    envs = sys.modules.get(_ENVS)
    return envs is None or not (envs._is_npu() or envs._is_musa() or envs._is_mps())


def sdpa_flash_cpu(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    attention_kwargs: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """xfuser's attention-function contract on CPU: q, k, v (b, h, s, d) -> (out, lse (b, h, s)
    fp32). Like xfuser's SDPA_FLASH it ignores attention_kwargs (USP already trimmed K/V)."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal
    )
    return out, lse


def _sdpa_flash_by_device(original: Callable) -> Callable:
    @functools.wraps(original)
    def sdpa_flash(query, key, value, dropout_p, is_causal, attention_kwargs=None):
        if query.device.type == "cpu":
            return sdpa_flash_cpu(query, key, value, dropout_p, is_causal, attention_kwargs)
        return original(query, key, value, dropout_p, is_causal, attention_kwargs=attention_kwargs)

    return sdpa_flash


def _on_cpu_answer(value: Any) -> Callable:
    """A wrapt wrapper: `value` on CPU, the wrapped function's own answer elsewhere."""

    def answer(wrapped, instance, args, kwargs):
        return value if _on_cpu() else wrapped(*args, **kwargs)

    return answer


def _is_npu_at_gate(wrapped, instance, args, kwargs):
    real = wrapped(*args, **kwargs)
    if real or torch.cuda.is_available():
        return real
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("wrapt"):
        frame = frame.f_back
    return bool(
        frame is not None
        and frame.f_code.co_name == "<module>"
        and frame.f_globals.get("__name__") in YUNCHANG_GATED
    )


def refuse_pipefusion(pp_degree: int) -> None:
    """PipeFusion's patch pipeline does not finish in CPU mode (the ranks wait until killed):
    refuse it when the pipeline is built, on every rank (each has the same config)."""
    if pp_degree > 1:
        raise NotImplementedError(
            f"--pipefusion_parallel_degree {pp_degree}: PipeFusion does not run in "
            "tokenring_xdit's CPU mode (it would wait until killed); use "
            "--pipefusion_parallel_degree 1 and split the ranks with --ulysses_degree / "
            "--ring_degree (or run on GPUs)"
        )


# AttentionBackendType names whose kernels run on CPU tensors: torch's SDPA (no lse) and its
# math path, and SDPA_FLASH (CPU mode's dispatch to torch's CPU flash kernel, which has an lse)
CPU_BACKENDS = ("SDPA", "SDPA_MATH", "SDPA_FLASH")


def refuse_without_cpu_version(backend: str | None) -> None:
    """ValueError for an explicit --attention_backend with no CPU kernel (None: automatic).
    xfuser registers its GPU kernels without a device check: `--attention_backend FLASH` on a
    CPU would end in flash-attn's `NameError: name 'flash_attn_func_2' is not defined`."""
    if backend is None or backend.upper() in CPU_BACKENDS:
        return
    raise ValueError(
        f"--attention_backend {backend} has no CPU version (tokenring_xdit's CPU mode runs xDiT "
        "on CPU tensors): leave --attention_backend out (CPU mode then picks SDPA_FLASH, the CPU "
        "kernel that returns the lse a ring needs) or pass --attention_backend SDPA_FLASH; "
        "run on GPUs for the others"
    )


def _select_backend(backend_type: Any) -> Callable:
    """Only the automatic choice changes: an explicit --attention_backend is kept. On CPU it
    also refuses PipeFusion (refuse_pipefusion), the first point that sees the parallel config.

    xfuser picks by what the build offers, not by the device: with a CPU build it falls to SDPA
    (no lse, refused for ring_degree > 1), with a CUDA build on a GPU-less machine
    `torch.backends.cudnn.is_available()` is True and it picks CUDNN, whose kernel has no CPU
    version. On CPU the only registered kernel that runs and returns an lse is SDPA_FLASH (our
    CPU dispatch), so that is the automatic choice there whatever xfuser found.
    """

    def select(wrapped, instance, args, kwargs):
        config = args[0] if args else kwargs.get("engine_config")
        if config is not None and _on_cpu():
            refuse_pipefusion(config.parallel_config.pp_degree)
            refuse_without_cpu_version(config.runtime_config.attention_backend)
        backend = wrapped(*args, **kwargs)
        if backend is not backend_type.SDPA_FLASH and _on_cpu():
            if not (config and config.runtime_config.attention_backend):
                return backend_type.SDPA_FLASH
        return backend

    return select


def _prepare_run(with_msl: bool, with_control_image: bool) -> Callable:
    """xfuser's warm-up call, on CPU with a CPU generator instead of a hard-coded 'cuda' one;
    the defaults of steps/sync_steps are read from the wrapped method, which differ."""

    def prepare_run(wrapped, instance, args, kwargs):
        if not _on_cpu():
            return wrapped(*args, **kwargs)
        if instance is None:  # through the class with a duck-typed pipeline: wrapped is unbound
            instance = args[0]
        # wrapped is bound to instance otherwise (a method or a partial), so self is not in args
        bound = inspect.signature(wrapped).bind(*args, **kwargs)
        bound.apply_defaults()
        extra = {}
        config = bound.arguments["input_config"]
        if with_msl:
            extra["max_sequence_length"] = config.max_sequence_length
        if with_control_image:
            from PIL import Image

            extra["control_image"] = Image.new("RGB", (config.width, config.height))
        return _cpu_prepare_run(
            instance, config, bound.arguments["steps"], bound.arguments["sync_steps"], extra
        )

    return prepare_run


def _cpu_prepare_run(pipe, input_config, steps: int, sync_steps: int, extra: dict) -> None:
    from xfuser.core.distributed import get_runtime_state

    runtime_config = get_runtime_state().runtime_config
    warmup_steps = runtime_config.warmup_steps
    runtime_config.warmup_steps = sync_steps
    try:
        pipe.__call__(
            height=input_config.height,
            width=input_config.width,
            prompt=[""] * input_config.batch_size if input_config.batch_size > 1 else "",
            num_inference_steps=steps,
            generator=torch.Generator(device="cpu").manual_seed(42),
            output_type=input_config.output_type,
            **extra,
        )
    finally:
        runtime_config.warmup_steps = warmup_steps


# ------------------------------------------------------------------------------------------
# One hook per xfuser module: the patches of CPU_PATCHES that land in it.


@functools.cache
def _yunchang_usable() -> bool:
    # The same names envs.check_long_ctx_attn imports before it reports True on a GPU.
    try:
        from yunchang import (  # noqa: F401
            LongContextAttention,
            LongContextAttentionQKVPacked,
            UlyssesAttention,
            ring_flash_attn_func,
            set_seq_parallel_pg,
        )
    except ImportError:
        return False
    return True


def _patch_envs(mod: ModuleType, p: PatchSet) -> None:
    for patch_id, name, wrapper in (
        ("xfuser_cpu.device_version", "get_device_version", _on_cpu_answer(None)),
        ("xfuser_cpu.long_ctx_gate", "_is_npu", _is_npu_at_gate),
        ("xfuser_cpu.dist_backend", "get_torch_distributed_backend", _on_cpu_answer("gloo")),
        ("xfuser_cpu.device", "get_device", _on_cpu_answer(torch.device("cpu"))),
        ("xfuser_cpu.device", "get_device_name", _on_cpu_answer("cpu")),
    ):
        p.aliased_wrapper(patch_id, mod, name, wrapper)


def _patch_long_ctx(mod: ModuleType, p: PatchSet) -> None:
    if mod.HAS_LONG_CTX_ATTN is False and _yunchang_usable():
        p.set_attr("xfuser_cpu.long_ctx_attn", mod, "HAS_LONG_CTX_ATTN", True)


def _patch_process_group(mod: ModuleType, p: PatchSet) -> None:
    if mod.PROCESS_GROUP is None and _yunchang_usable():
        from yunchang.globals import PROCESS_GROUP

        p.set_attr("xfuser_cpu.process_group", mod, "PROCESS_GROUP", PROCESS_GROUP)


def _patch_backend_registry(mod: ModuleType, p: PatchSet) -> None:
    registry, key = mod.ATTENTION_FUNCTION_REGISTRY, mod.AttentionBackendType.SDPA_FLASH
    p.set_item("xfuser_cpu.sdpa_flash_cpu", registry, key, _sdpa_flash_by_device(registry[key]))


def _patch_runtime_state(mod: ModuleType, p: PatchSet) -> None:
    p.aliased_wrapper(
        "xfuser_cpu.select_backend",
        mod.RuntimeState,
        "_select_attention_backend",
        _select_backend(mod.AttentionBackendType),
    )


def _patch_coordinator(mod: ModuleType, p: PatchSet) -> None:
    _patch_long_ctx(mod, p)
    p.aliased_wrapper("xfuser_cpu.synchronize", mod, "synchronize", _on_cpu_answer(None))


def _patch_prepare_run(mod: ModuleType, p: PatchSet) -> None:
    cls, with_msl, with_control_image = CUDA_GENERATOR_PREPARE_RUNS[mod.__name__]
    p.aliased_wrapper(
        "xfuser_cpu.prepare_run",
        getattr(mod, cls),
        "prepare_run",
        _prepare_run(with_msl, with_control_image),
    )


# Import order inside xfuser: envs runs first, everything else imports from it.
_HOOKS: dict[str, Callable[[ModuleType, PatchSet], None]] = {
    _ENVS: _patch_envs,
    **{name: _patch_long_ctx for name in LONG_CTX_MODULES},
    **{name: _patch_process_group for name in PROCESS_GROUP_MODULES},
    "xfuser.core.distributed.attention_backend": _patch_backend_registry,
    "xfuser.core.distributed.runtime_state": _patch_runtime_state,
    COORDINATOR: _patch_coordinator,
    **{name: _patch_prepare_run for name in CUDA_GENERATOR_PREPARE_RUNS},
}


# ------------------------------------------------------------------------------------------
# Public switch.


class _CpuMode:
    """CPU mode's state: on or off, the hooked modules whose hook is armed but not yet fired
    (`pending`), and those patched (`applied`: module name -> its changes, in application
    order). At most one entry per hooked module (_HOOKS); disable() empties `applied`."""

    def __init__(self) -> None:
        self.enabled = False
        self.pending: set[str] = set()
        self.applied: dict[str, PatchSet] = {}


_MODE = _CpuMode()


def _apply(name: str, mod: ModuleType) -> None:
    """Patch one freshly imported module, all or nothing."""
    if name in _MODE.applied:
        return
    patches = PatchSet("xfuser", XFUSER_VERSIONS)
    patches.apply(lambda p: _HOOKS[name](mod, p))  # all or nothing
    _MODE.applied[name] = patches


def _on_import(mod: ModuleType) -> None:
    """wrapt post-import hook: runs right after the module body, before dependents continue."""
    name = mod.__name__
    _MODE.pending.discard(name)
    if _MODE.enabled:
        _apply(name, mod)


def _check_requirements() -> None:
    check_host_version("xfuser", XFUSER_VERSIONS)  # before any hook is armed
    # xfuser.core.sparge_attention.block_mask imports triton unconditionally; the real package
    # imports fine without a GPU (it only defines kernels at import).
    if importlib.util.find_spec("triton") is None:
        raise ImportError(
            "CPU mode for xDiT needs the 'triton' package (xfuser 0.7.0 imports it "
            "unconditionally; it works without a GPU): pip install 'tokenring-xdit[cpu]'"
        )


def enable() -> list[str]:
    """Switch CPU mode on; call it before the first `import xfuser`. Idempotent.

    Modules already imported are patched now; the others when they are imported. Returns the
    patch ids (see CPU_PATCHES) applied or armed, each once, in table order.
    """
    _check_requirements()
    _MODE.enabled = True
    for name in _HOOKS:
        if name in _MODE.applied or name in _MODE.pending:
            continue
        if name not in sys.modules:
            _MODE.pending.add(name)
        # wrapt calls the hook at once if the module is already imported.
        wrapt.register_post_import_hook(_on_import, name)
    return _ids(set(_MODE.applied) | _MODE.pending)


def disable() -> None:
    """Switch CPU mode off: every patched symbol (and alias of it) is the original again, and
    hooks still pending apply nothing. Idempotent."""
    _MODE.enabled = False
    for name in reversed(list(_MODE.applied)):
        _MODE.applied.pop(name).revert()


def is_enabled() -> bool:
    return _MODE.enabled


def applied_patches() -> list[str]:
    """Ids of the patch points in effect now (a module is patched once it has been imported)."""
    return _ids(set(_MODE.applied), only_applied=True)


def hooked_modules() -> tuple[str, ...]:
    """The xfuser modules CPU mode patches (each when it is imported)."""
    return tuple(_HOOKS)


def _ids(modules: set[str], only_applied: bool = False) -> list[str]:
    """Patch ids in table order: those applied in an imported module, all of a pending one."""
    ids: list[str] = []
    for patch in CPU_PATCHES:
        if patch.trigger not in modules or patch.id in ids:
            continue
        applied = _MODE.applied.get(patch.trigger)
        if applied is not None and patch.id not in applied.applied:
            continue
        if only_applied and applied is None:
            continue
        ids.append(patch.id)
    return ids


def applied() -> list[str]:
    """Patch-set protocol (patches/__init__): the ids applied now."""
    return applied_patches()


def revert() -> None:
    """Patch-set protocol: undo everything (uninstall)."""
    disable()
