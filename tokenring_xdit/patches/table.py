"""The patch table: every place tokenring_xdit changes a host library, in one list.

`patches/README.md` (top level) is generated from this table (`tokenring-xdit patches
--markdown`, rendered by patches/audit.py) and a test keeps the two equal, so the audit cannot
drift from the code. Every PatchSet change names a row id here (base.py refuses others), and a
test applies every row. Rows come in three switches: applied when the host is imported
(automatic), by the opt-in CPU mode (`tokenring_xdit.patches.xfuser_cpu.enable()`,
`patches.diffusers_cpu.enable()`), or by our own runtime (torch).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PatchPoint:
    id: str
    host: str  # distribution whose code is changed
    trigger: str  # module whose import applies the patch (entry-point name)
    target: str  # module:symbol that changes
    # "registry entry", "missing symbol" or "wrapper" (reversible: a wrapt wrapper, or a plain
    # function where compiled models call it, which Dynamo traces: PatchSet.traced_wrapper)
    kind: str
    versions: str  # host versions the patch is checked against; others are refused
    change: str  # what it changes, and why
    switch: str = "automatic"  # AUTOMATIC, CPU_MODE or RUNTIME


YUNCHANG_VERSIONS = ">=0.6.4,<0.7"
XFUSER_VERSIONS = ">=0.7.0,<0.8"
TORCH_VERSIONS = ">=2.5"
XFUSER_CPU_VERSIONS = "==0.7.0"
# Tested with 0.42.1; the parameter names of both wrapped functions are checked at apply time.
DIFFUSERS_VERSIONS = ">=0.36"
# The CPU shims wrap _native_flash_attention_forward_op, which diffusers 0.37 introduced.
DIFFUSERS_CPU_VERSIONS = ">=0.37"
_DISPATCH = "diffusers.models.attention_dispatch"
# Trigger of patches that our own runtime applies (not a host import).
# (the ring installs its own guard then: ring/comm/teardown.py; patches/torch_dist.py is its row)
FIRST_GRAPH_CAPTURE = "first ring communicators or CUDA graph capture"
AUTOMATIC = "automatic"  # when the trigger module is imported (bootstrap) or by install()
CPU_MODE = "CPU mode"  # patches.xfuser_cpu / patches.diffusers_cpu .enable(), then the import
RUNTIME = "runtime"  # by tokenring_xdit itself, at the trigger event

# xfuser modules CPU mode patches (each when it is imported), by what they need.
_ENVS = "xfuser.envs"
_BACKEND = "xfuser.core.distributed.attention_backend"
_RUNTIME_STATE = "xfuser.core.distributed.runtime_state"
_USP = "xfuser.model_executor.layers.usp"
COORDINATOR = "xfuser.core.distributed.group_coordinator"
# Modules that copy envs.PACKAGES_CHECKER's "has_long_ctx_attn" into a module constant at import.
LONG_CTX_MODULES = (
    "xfuser.config.config",
    COORDINATOR,
    "xfuser.core.distributed.parallel_state",
    "xfuser.model_executor.layers.attention_processor",
    "xfuser.model_executor.models.transformers.transformer_flux",
    "xfuser.model_executor.models.transformers.transformer_flux2",
    "xfuser.model_executor.models.transformers.transformer_wan",
)
# Modules whose `if torch.cuda.is_available() or envs._is_npu(): from yunchang.globals import
# PROCESS_GROUP / else: PROCESS_GROUP = None` left them without yunchang's process groups.
PROCESS_GROUP_MODULES = (
    "xfuser.core.distributed.fp8_comms",
    "xfuser.core.sparge_attention.head_balance",
    _USP,
)
# Modules whose body imports yunchang's classes under `if torch.cuda.is_available() or
# envs._is_npu():` and otherwise defines placeholders (base class `object`, AttnType = None).
YUNCHANG_GATED = (
    "xfuser.core.long_ctx_attention.hybrid.attn_layer",
    "xfuser.core.long_ctx_attention.ring.ring_flash_attn",
    "xfuser.core.long_ctx_attention.ring.ring_npu_flash_attn",
)
_PIPELINES = "xfuser.model_executor.pipelines."
# Pipeline wrappers whose prepare_run builds torch.Generator(device="cuda"):
# module -> (class, passes max_sequence_length, passes a blank control_image)
CUDA_GENERATOR_PREPARE_RUNS = {
    _PIPELINES + "pipeline_flux": ("xFuserFluxPipeline", True, False),
    _PIPELINES + "pipeline_flux2": ("xFuserFlux2PipelineBase", True, False),
    _PIPELINES + "pipeline_flux_control": ("xFuserPipelineFluxControlPipeline", True, True),
    _PIPELINES + "pipeline_sana": ("xFuserSanaPipeline", False, False),
    _PIPELINES + "pipeline_sana_sprint": ("xFuserSanaSprintPipeline", False, False),
    _PIPELINES + "pipeline_stable_diffusion_3": ("xFuserStableDiffusion3Pipeline", False, False),
}


def _cpu(patch_id: str, module: str, symbol: str, kind: str, change: str) -> PatchPoint:
    return PatchPoint(
        patch_id,
        "xfuser",
        module,
        f"{module}:{symbol}",
        kind,
        XFUSER_CPU_VERSIONS,
        change,
        CPU_MODE,
    )


_CPU_ROWS: tuple[PatchPoint, ...] = (
    _cpu(
        "xfuser_cpu.device_version",
        _ENVS,
        "get_device_version",
        "wrapper",
        "raises NotImplementedError without an accelerator, and config.py reads CUDA_VERSION "
        "from it at import; on CPU it returns None, as xfuser already does for MPS/NPU",
    ),
    _cpu(
        "xfuser_cpu.long_ctx_gate",
        _ENVS,
        "_is_npu",
        "wrapper",
        "answers True only to the module-level yunchang gate of "
        + ", ".join(YUNCHANG_GATED)
        + ", so xFuserLongContextAttention is built on yunchang's LongContextAttention (as on "
        "CUDA) instead of `object`; every other caller gets the real answer",
    ),
    _cpu(
        "xfuser_cpu.dist_backend",
        _ENVS,
        "get_torch_distributed_backend",
        "wrapper",
        "has no CPU branch (raises); on CPU it returns 'gloo' for the world and model groups",
    ),
    _cpu(
        "xfuser_cpu.device",
        _ENVS,
        "get_device, get_device_name",
        "wrapper",
        "a CUDA build of torch on a machine without a GPU reports 'cuda'; on CPU they return "
        "the CPU device (a no-op with a CPU build of torch)",
    ),
    *(
        _cpu(
            "xfuser_cpu.long_ctx_attn",
            name,
            "HAS_LONG_CTX_ATTN",
            "module constant",
            "frozen to False at import without CUDA (envs.check_long_ctx_attn), which refuses "
            "sp_degree > 1 and keeps yunchang's ulysses/ring groups from being built; set to "
            "True when yunchang imports",
        )
        for name in LONG_CTX_MODULES
    ),
    *(
        _cpu(
            "xfuser_cpu.process_group",
            name,
            "PROCESS_GROUP",
            "module constant",
            "a CUDA/NPU-gated import left it None; set to yunchang.globals.PROCESS_GROUP (the "
            "singleton whose ULYSSES_PG/RING_PG set_seq_parallel_pg fills later)",
        )
        for name in PROCESS_GROUP_MODULES
    ),
    _cpu(
        "xfuser_cpu.sdpa_flash_cpu",
        _BACKEND,
        "ATTENTION_FUNCTION_REGISTRY[AttentionBackendType.SDPA_FLASH]",
        "registry entry",
        "no registered kernel returns a log-sum-exp on CPU, and ring attention merges blocks "
        "by it; CPU tensors go to aten._scaled_dot_product_flash_attention_for_cpu (out and "
        "a real fp32 lse), other devices to xfuser's own function",
    ),
    _cpu(
        "xfuser_cpu.select_backend",
        _RUNTIME_STATE,
        "RuntimeState._select_attention_backend",
        "wrapper",
        "xfuser picks by the build, not the device: SDPA with a CPU build of torch (no lse, "
        "refused when ring_degree > 1), CUDNN with a CUDA build on a GPU-less machine (no CPU "
        "kernel); on CPU with no --attention_backend given it picks SDPA_FLASH instead. "
        "It also refuses, on CPU, --pipefusion_parallel_degree > 1 (the first call that sees "
        "the parallel config; PipeFusion waits there until killed) and an explicit "
        "--attention_backend with no CPU kernel (FLASH, CUDNN, ...; xfuser would end in a "
        "NameError), each with a clear error naming the fix",
    ),
    _cpu(
        "xfuser_cpu.synchronize",
        COORDINATOR,
        "synchronize",
        "wrapper",
        "the module's alias of torch.cuda.synchronize, called between PipeFusion's "
        "send/recv batches; a no-op on CPU (gloo's waits already completed the transfers)",
    ),
    *(
        _cpu(
            "xfuser_cpu.prepare_run",
            name,
            f"{cls}.prepare_run",
            "wrapper",
            "the warm-up call builds torch.Generator(device='cuda'); on CPU the same call "
            "(same inputs and seed) with a CPU generator",
        )
        for name, (cls, _, _) in CUDA_GENERATOR_PREPARE_RUNS.items()
    ),
)

_HOST_VERSIONS = {
    "yunchang": YUNCHANG_VERSIONS,
    "xfuser": XFUSER_VERSIONS,
    "diffusers": DIFFUSERS_VERSIONS,
}


def _auto(patch_id: str, target: str, kind: str, change: str) -> PatchPoint:
    """A row applied when its host is imported: the id's prefix names the host and trigger."""
    host = patch_id.split(".")[0]
    return PatchPoint(patch_id, host, host, target, kind, _HOST_VERSIONS[host], change)


PATCH_TABLE: tuple[PatchPoint, ...] = (
    _auto(
        "yunchang.ring_impl",
        "yunchang.hybrid.utils:RING_IMPL_DICT['token_ring']",
        "registry entry",
        "adds TokenRing as ring_impl_type='token_ring' for LongContextAttention (same dict object "
        "as yunchang.hybrid.attn_layer imports); yunchang's own rings are untouched",
    ),
    _auto(
        "yunchang.ring_impl_qkvpacked",
        "yunchang.hybrid.utils:RING_IMPL_QKVPACKED_DICT['token_ring']",
        "registry entry",
        "adds the QKV-packed TokenRing for LongContextAttentionQKVPacked",
    ),
    _auto(
        "yunchang.extract_local",
        "yunchang.comm.extract_local:EXTRACT_FUNC_DICT['token_ring']",
        "registry entry",
        "TokenRing takes zigzag shards (yunchang's zigzag_extract_local, chunks r and 2N-1-r, "
        "which also records the split as the causal check's proof); non-causal TokenRing is "
        "exact on any sharding, so xDiT's USP keeps its own contiguous shards",
    ),
    _auto(
        "yunchang.set_seq_parallel_pg",
        "yunchang.globals:set_seq_parallel_pg (and its alias yunchang:set_seq_parallel_pg)",
        "wrapper",
        "after yunchang builds the ulysses/ring groups (made without a timeout: torch's 30-min "
        "default), gives them the ring's deadline and creates TokenRing's communicators",
    ),
    _auto(
        "yunchang.ring_impl_type_check",
        "yunchang.hybrid.attn_layer:LongContextAttention.__init__ and "
        "LongContextAttentionQKVPacked.__init__",
        "wrapper",
        "an unknown ring_impl_type raises a ValueError (also a KeyError) that lists the "
        "valid names, instead of a bare KeyError",
    ),
    _auto(
        "yunchang.update_npu_out",
        "yunchang.ring.utils:update_npu_out (added only where missing)",
        "missing symbol",
        "xfuser 0.7.0's long_ctx_attention.ring imports this name, which only yunchang's git "
        "main has, so xFuserLongContextAttention fails to build on CUDA; the added function "
        "raises a clear NotImplementedError if an NPU ring ever calls it",
    ),
    _auto(
        "xfuser.usp_ring_attn",
        "xfuser.model_executor.layers.usp:ring_attn",
        "wrapper",
        "the ring step of USP (PixArt, Flux, SD3, ... in xfuser 0.7): runs TokenRing on "
        "PROCESS_GROUP.RING_PG with xDiT's selected kernel when TokenRing is selected, xDiT's "
        "own ring otherwise; says once on rank 0 which ring runs",
    ),
    _auto(
        "xfuser.usp_kv_passthrough",
        "xfuser.model_executor.layers.usp:_update_and_get_kv_cache",
        "wrapper",
        "USP's K/V cache step, which without PipeFusion (num_pipeline_patch == 1) only "
        "concatenates K and V and copies them back contiguous for a ring that moves K/V: when "
        "TokenRing is selected (not `auto`) and the ring degree is > 1, K/V are handed on as "
        "they are (TokenRing's K/V never move); with PipeFusion, another ring or ring degree 1, "
        "xDiT's own step runs",
    ),
    _auto(
        "xfuser.ring_impl_flag",
        "xfuser.config.args:xFuserArgs.add_cli_args and xFuserArgs.add_runner_args",
        "wrapper",
        "adds --ring_impl_type {default,token_ring} to the parsers xDiT's scripts and the "
        "xdit runner build",
    ),
    _auto(
        "xfuser.ring_impl_flag_read",
        "xfuser.config.args:xFuserArgs.from_cli_args and xFuserArgs.from_runner_args",
        "wrapper",
        "reads --ring_impl_type in each worker (from_cli_args drops unknown fields)",
    ),
    _auto(
        "xfuser.long_ctx_kv_cache",
        "xfuser.core.long_ctx_attention.hybrid.attn_layer:"
        "xFuserLongContextAttention.ring_impl_type_supported_kv_cache",
        "registry entry",
        "allows ring_impl_type='token_ring' with use_kv_cache=True (PipeFusion)",
    ),
    _auto(
        "xfuser.long_ctx_ring_fn",
        "xfuser.core.long_ctx_attention.hybrid.attn_layer:xFuserLongContextAttention.__init__",
        "wrapper",
        "when TokenRing is selected (ring_impl_type='token_ring' or the xDiT selection), the "
        "layer's ring function becomes TokenRing with KV cache and joint tensors",
    ),
    _auto(
        "xfuser.cuda_graph_transformer",
        "xfuser.model_executor.pipelines.base_pipeline:"
        "xFuserPipelineBaseWrapper._convert_transformer_backbone",
        "wrapper",
        "only with TOKENRING_XDIT_CUDA_GRAPH_TRANSFORMER=1: the wrapped transformer replays its "
        "forward as one CUDA graph per input signature (tokenring_xdit.hosts.transformer_graphs); "
        "refused, with a warning, under PipeFusion, step caches or torch.compile",
    ),
    _auto(
        "diffusers.cp_ring",
        f"{_DISPATCH}:_templated_context_parallel_attention",
        "wrapper",
        "the context-parallel call of every CP-capable attention backend: when TokenRing is "
        "selected and ring_degree > 1, the ring (ring-only, ring_anything, and inside ulysses x "
        "ring) runs TokenRing on the ring mesh's group with the backend's forward op as the "
        "block kernel (backends without an lse are refused); diffusers' own code otherwise; "
        "says once on rank 0 which ring runs. Applied when diffusers.models.attention_dispatch "
        "is imported",
    ),
    _auto(
        "diffusers.cp_setup",
        "diffusers.models._modeling_parallel:ContextParallelConfig.setup",
        "wrapper",
        "after diffusers derives the ring/ulysses meshes (enable_parallelism and "
        "from_pretrained(parallel_config=...)), creates TokenRing's communicators for the ring "
        "group when TokenRing is selected (an optimisation: the first ring call would)",
    ),
    PatchPoint(
        "torch.destroy_process_group",
        "torch",
        FIRST_GRAPH_CAPTURE,
        "torch.distributed.distributed_c10d:destroy_process_group (and its alias "
        "torch.distributed:destroy_process_group)",
        "wrapper",
        TORCH_VERSIONS,
        "frees tokenring_xdit's CUDA graphs first (a graph holding NCCL kernels makes "
        "destroy_process_group hang, pytorch/pytorch#115388; xDiT calls it at exit), then "
        "tears down TokenRing's own communicators and caches, so nothing of ours keeps the "
        "destroyed group and its gloo threads alive into interpreter exit (an abort); after a "
        "ring failed on NCCL, ending the world aborts every group instead (a destroy waits for a "
        "peer that may be stopped)",
        RUNTIME,
    ),
    *_CPU_ROWS,
    *(
        PatchPoint(
            pid, "diffusers", _DISPATCH, target, "wrapper", DIFFUSERS_CPU_VERSIONS, why, CPU_MODE
        )
        for pid, target, why in (
            (
                "diffusers_cpu.device_index",
                "diffusers.models.modeling_utils:ModelMixin._resolve_parallel_config",
                "without an accelerator device (CPU build, or CUDA build and no GPU), "
                "torch.accelerator.device_count() reads 1 during the call, which computes "
                "rank % device_count() (ZeroDivisionError on CPU)",
            ),
            (
                "diffusers_cpu.native_flash_forward",
                f"{_DISPATCH}:_native_flash_attention_forward_op",
                "on CPU tensors runs torch's CPU flash kernel, which returns out and lse, instead "
                "of the CUDA-only op, so the '_native_flash' backend serves CP rings on gloo (no "
                "CP backend has a CPU kernel with an lse)",
            ),
            (
                "diffusers_cpu.native_flash_backward",
                f"{_DISPATCH}:_native_flash_attention_backward_op",
                "on CPU tensors raises a clear NotImplementedError (CPU mode is forward-only) "
                "instead of failing in the CUDA-only backward kernel",
            ),
            (
                "diffusers_cpu.gather_sizes",
                "diffusers.models._modeling_parallel:gather_size_by_comm (and the names "
                f"{_DISPATCH} and diffusers.hooks.context_parallel imported)",
                "without an accelerator device, exchanges the ranks' lengths in CPU tensors; "
                "it would place them on current_accelerator(), 'cuda' with a CUDA build and "
                "no GPU",
            ),
            (
                "diffusers_cpu.gather_anything",
                "diffusers.hooks.context_parallel:_all_gather_anything",
                "on gloo, pads uneven shards (ring_anything) to the longest before the output "
                "all-gather and cuts them back after; gloo refuses unequal all_gather sizes, NCCL "
                "does not",
            ),
        )
    ),
)

PATCH_IDS = frozenset(p.id for p in PATCH_TABLE)
# Host modules whose import applies the automatic rows, in the order their sets must apply
# (yunchang first: xfuser's patches build on it). _bootstrap.TRIGGERS and the entry points in
# pyproject.toml must list the same names (a test checks).
TRIGGERS = tuple(dict.fromkeys(p.trigger for p in PATCH_TABLE if p.switch == AUTOMATIC))
