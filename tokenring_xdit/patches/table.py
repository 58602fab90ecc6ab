"""The patch table: every place tokenring_xdit changes a host library, in one list.

`patches/README.md` (top level) is generated from this table (`tokenring-xdit patches
--markdown`) and a test keeps the two equal, so the audit cannot drift from the code.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PatchPoint:
    id: str
    host: str  # distribution whose code is changed
    trigger: str  # module whose import applies the patch (entry-point name)
    target: str  # module:symbol that changes
    kind: str  # "registry entry", "missing symbol" or "wrapper" (a reversible wrapt wrapper)
    versions: str  # host versions the patch is checked against; others are refused
    change: str  # what it changes, and why


YUNCHANG_VERSIONS = ">=0.6.4,<0.7"
XFUSER_VERSIONS = ">=0.7.0,<0.8"
TORCH_VERSIONS = ">=2.5"
# Trigger of patches that our own runtime applies (not a host import).
FIRST_GRAPH_CAPTURE = "first CUDA graph capture"

PATCH_TABLE: tuple[PatchPoint, ...] = (
    PatchPoint(
        "yunchang.ring_impl",
        "yunchang",
        "yunchang",
        "yunchang.hybrid.utils:RING_IMPL_DICT['token_ring']",
        "registry entry",
        YUNCHANG_VERSIONS,
        "adds TokenRing as ring_impl_type='token_ring' for LongContextAttention (same dict object "
        "as yunchang.hybrid.attn_layer imports); yunchang's own rings are untouched",
    ),
    PatchPoint(
        "yunchang.ring_impl_qkvpacked",
        "yunchang",
        "yunchang",
        "yunchang.hybrid.utils:RING_IMPL_QKVPACKED_DICT['token_ring']",
        "registry entry",
        YUNCHANG_VERSIONS,
        "adds the QKV-packed TokenRing for LongContextAttentionQKVPacked",
    ),
    PatchPoint(
        "yunchang.extract_local",
        "yunchang",
        "yunchang",
        "yunchang.comm.extract_local:EXTRACT_FUNC_DICT['token_ring']",
        "registry entry",
        YUNCHANG_VERSIONS,
        "TokenRing shards the sequence contiguously, like 'basic' (maps to basic_extract_local)",
    ),
    PatchPoint(
        "yunchang.set_seq_parallel_pg",
        "yunchang",
        "yunchang",
        "yunchang.globals:set_seq_parallel_pg (and its alias yunchang:set_seq_parallel_pg)",
        "wrapper",
        YUNCHANG_VERSIONS,
        "after yunchang builds the ulysses/ring groups, creates TokenRing's return "
        "communicator for every ring group, collectively, in the same order on all ranks",
    ),
    PatchPoint(
        "yunchang.ring_impl_type_check",
        "yunchang",
        "yunchang",
        "yunchang.hybrid.attn_layer:LongContextAttention.__init__ and "
        "LongContextAttentionQKVPacked.__init__",
        "wrapper",
        YUNCHANG_VERSIONS,
        "an unknown ring_impl_type raises a ValueError (also a KeyError) that lists the "
        "valid names, instead of a bare KeyError",
    ),
    PatchPoint(
        "yunchang.update_npu_out",
        "yunchang",
        "yunchang",
        "yunchang.ring.utils:update_npu_out (added only where missing)",
        "missing symbol",
        YUNCHANG_VERSIONS,
        "xfuser 0.7.0's long_ctx_attention.ring imports this name, which only yunchang's git "
        "main has, so xFuserLongContextAttention fails to build on CUDA; the added function "
        "raises a clear NotImplementedError if an NPU ring ever calls it",
    ),
    PatchPoint(
        "xfuser.usp_ring_attn",
        "xfuser",
        "xfuser",
        "xfuser.model_executor.layers.usp:ring_attn",
        "wrapper",
        XFUSER_VERSIONS,
        "the ring step of USP (PixArt, Flux, SD3, ... in xfuser 0.7): runs TokenRing on "
        "PROCESS_GROUP.RING_PG with xDiT's selected kernel when TokenRing is selected, xDiT's "
        "own ring otherwise; says once on rank 0 which ring runs",
    ),
    PatchPoint(
        "xfuser.ring_impl_flag",
        "xfuser",
        "xfuser",
        "xfuser.config.args:xFuserArgs.add_cli_args and xFuserArgs.add_runner_args",
        "wrapper",
        XFUSER_VERSIONS,
        "adds --ring_impl_type {default,token_ring} to the parsers xDiT's scripts and the "
        "xdit runner build",
    ),
    PatchPoint(
        "xfuser.ring_impl_flag_read",
        "xfuser",
        "xfuser",
        "xfuser.config.args:xFuserArgs.from_cli_args and xFuserArgs.from_runner_args",
        "wrapper",
        XFUSER_VERSIONS,
        "reads --ring_impl_type in each worker (from_cli_args drops unknown fields)",
    ),
    PatchPoint(
        "xfuser.long_ctx_kv_cache",
        "xfuser",
        "xfuser",
        "xfuser.core.long_ctx_attention.hybrid.attn_layer:"
        "xFuserLongContextAttention.ring_impl_type_supported_kv_cache",
        "registry entry",
        XFUSER_VERSIONS,
        "allows ring_impl_type='token_ring' with use_kv_cache=True (PipeFusion)",
    ),
    PatchPoint(
        "xfuser.long_ctx_ring_fn",
        "xfuser",
        "xfuser",
        "xfuser.core.long_ctx_attention.hybrid.attn_layer:xFuserLongContextAttention.__init__",
        "wrapper",
        XFUSER_VERSIONS,
        "when TokenRing is selected (ring_impl_type='token_ring' or the xDiT selection), the "
        "layer's ring function becomes TokenRing with KV cache and joint tensors",
    ),
    PatchPoint(
        "xfuser.cuda_graph_transformer",
        "xfuser",
        "xfuser",
        "xfuser.model_executor.pipelines.base_pipeline:"
        "xFuserPipelineBaseWrapper._convert_transformer_backbone",
        "wrapper",
        XFUSER_VERSIONS,
        "only with TOKENRING_XDIT_CUDA_GRAPH_TRANSFORMER=1: the wrapped transformer replays its "
        "forward as one CUDA graph per input signature (tokenring_xdit.transformer_graphs); "
        "refused, with a warning, under PipeFusion, step caches or torch.compile",
    ),
    PatchPoint(
        "torch.destroy_process_group",
        "torch",
        FIRST_GRAPH_CAPTURE,
        "torch.distributed.distributed_c10d:destroy_process_group (and its alias "
        "torch.distributed:destroy_process_group)",
        "wrapper",
        TORCH_VERSIONS,
        "frees tokenring_xdit's CUDA graphs first: a graph holding NCCL kernels makes "
        "destroy_process_group hang (pytorch/pytorch#115388), which xDiT calls at exit",
    ),
)


def to_markdown() -> str:
    """The audit document for patches/README.md."""
    lines = [
        "# Patch points",
        "",
        "Every change tokenring_xdit makes to a host library, generated from",
        "`tokenring_xdit/patches/table.py` by `tokenring-xdit patches --markdown`",
        "(a test fails when this file and the table differ). All patches of a host are applied",
        "together when its trigger module is imported (or by `tokenring_xdit.install()`), only",
        "for the host versions listed, and `tokenring_xdit.uninstall()` reverts every one.",
        "Set `TOKENRING_XDIT_AUTOPATCH=0` to keep them from being applied automatically.",
        "",
        "| id | host | trigger | target | kind | versions | change |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in PATCH_TABLE:
        lines.append(
            f"| `{p.id}` | {p.host} | `{p.trigger}` | `{p.target}` | {p.kind} | "
            f"`{p.versions}` | {p.change} |"
        )
    return "\n".join(lines) + "\n"
