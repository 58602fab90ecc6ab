"""xfuser patch set: TokenRing as xDiT's ring, chosen by flag, environment or Python call.

Applied once `xfuser` has finished importing, all or nothing; the points are listed in table.py.
The ring dispatcher keeps xDiT's own ring unless TokenRing is selected (see selection.py), so
installing the package changes nothing until a user asks for TokenRing.
"""

from __future__ import annotations

import logging
import weakref

from ..hosts import selection
from .base import PatchSet, post_import_hook
from .table import XFUSER_VERSIONS

PATCHES = PatchSet("xfuser", XFUSER_VERSIONS)

# A child of xDiT's logger, so the line appears in xDiT's own log format and level.
log = logging.getLogger("xfuser.tokenring_xdit")
_announced: set[str] = set()
# xFuserLongContextAttention layers whose ring function we replaced -> the one xDiT chose
_TAKEN_OVER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _announce(impl: str, source: str) -> None:
    """Say once per process, on global rank 0, which ring xDiT runs."""
    if impl in _announced:
        return
    _announced.add(impl)
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        what = "TokenRing (tokenring_xdit)" if impl == selection.TOKEN_RING else "xDiT's own ring"
        log.info("ring attention: %s, selected by %s", what, source)


def _ring_attn_dispatch(wrapped, instance, args, kwargs):
    impl, source = selection.xdit_ring_impl()
    _announce(impl, source)
    if impl == selection.TOKEN_RING:
        from ..hosts.xdit import usp_ring_attn

        return usp_ring_attn(*args, **kwargs)
    return wrapped(*args, **kwargs)


def _add_flag(wrapped, instance, args, kwargs):
    parser = wrapped(*args, **kwargs)
    target = parser if parser is not None else (args[0] if args else kwargs["parser"])
    target.add_argument(
        "--ring_impl_type",
        type=str,
        default=None,
        choices=list(selection.XDIT_RING_IMPLS),
        help="Ring attention of the ring dimension: 'default' (xDiT's own) or 'token_ring' "
        f"(TokenRing, from tokenring_xdit). Overrides ${selection.RING_IMPL_ENV}.",
    )
    return parser


def _read_flag_namespace(wrapped, instance, args, kwargs):
    namespace = args[0] if args else kwargs["args"]
    selection.set_from_flag(getattr(namespace, "ring_impl_type", None))
    return wrapped(*args, **kwargs)


def _read_flag_dict(wrapped, instance, args, kwargs):
    options = args[0] if args else kwargs["args"]
    selection.set_from_flag(options.get("ring_impl_type"))
    return wrapped(*args, **kwargs)


def _long_ctx_init(wrapped, instance, args, kwargs):
    """After xFuserLongContextAttention picks its ring function, take over when selected."""
    wrapped(*args, **kwargs)
    import inspect

    requested = inspect.signature(wrapped).bind(*args, **kwargs).arguments.get("ring_impl_type")
    if requested == selection.TOKEN_RING or selection.xdit_ring_impl()[0] == selection.TOKEN_RING:
        from ..hosts.xdit import long_ctx_ring_attn

        _TAKEN_OVER[instance] = instance.ring_attn_fn
        instance.ring_attn_fn = long_ctx_ring_attn


def _give_back_ring_fns() -> None:
    """Uninstall: layers built while patched run xDiT's own ring function again."""
    for layer, original in list(_TAKEN_OVER.items()):
        layer.ring_attn_fn = original
    _TAKEN_OVER.clear()


def _graph_transformer(wrapped, instance, args, kwargs):
    """With TOKENRING_XDIT_CUDA_GRAPH_TRANSFORMER=1, graph the transformer xDiT just wrapped."""
    transformer = wrapped(*args, **kwargs)
    from ..hosts import transformer_graphs

    if not transformer_graphs.graph_transformer_requested():
        return transformer
    import inspect

    bound = inspect.signature(wrapped).bind(*args, **kwargs).arguments
    config = instance.engine_config
    blockers = {
        "PipeFusion (pipefusion_parallel_degree > 1)": config.parallel_config.pp_degree > 1,
        "a step cache (cache_args)": bool(bound.get("cache_args")),
        "torch.compile / onediff": bool(
            bound.get("enable_torch_compile") or bound.get("enable_onediff")
        ),
    }
    refused = [name for name, present in blockers.items() if present]
    if refused:
        log.warning(
            "%s is set, but the transformer stays eager: %s change Python state between "
            "steps, which a replayed graph would not see",
            transformer_graphs.GRAPH_TRANSFORMER_ENV,
            " and ".join(refused),
        )
    else:
        transformer_graphs.graph_transformer(transformer)
    return transformer


def _build(patches: PatchSet) -> None:
    from . import yunchang as yunchang_patches

    # TokenRing under xDiT needs the yunchang set (the ring registration and the return
    # communicators made in set_seq_parallel_pg): without it, patch nothing of xfuser either.
    if not yunchang_patches.PATCHES.active:
        yunchang_patches.apply()  # raises (e.g. UnsupportedHostVersion) when it cannot
    import xfuser.config.args as args_module
    import xfuser.core.long_ctx_attention.hybrid.attn_layer as long_ctx
    import xfuser.model_executor.layers.usp as usp
    import xfuser.model_executor.pipelines.base_pipeline as base_pipeline

    patches.wrapper("xfuser.usp_ring_attn", usp, "ring_attn", _ring_attn_dispatch)
    for name in ("add_cli_args", "add_runner_args"):
        patches.wrapper("xfuser.ring_impl_flag", args_module, f"xFuserArgs.{name}", _add_flag)
    patches.wrapper(
        "xfuser.ring_impl_flag_read",
        args_module,
        "xFuserArgs.from_cli_args",
        _read_flag_namespace,
    )
    patches.wrapper(
        "xfuser.ring_impl_flag_read",
        args_module,
        "xFuserArgs.from_runner_args",
        _read_flag_dict,
    )
    cls = long_ctx.xFuserLongContextAttention
    patches.list_entry(
        "xfuser.long_ctx_kv_cache", cls.ring_impl_type_supported_kv_cache, selection.TOKEN_RING
    )
    patches.wrapper(
        "xfuser.long_ctx_ring_fn", long_ctx, "xFuserLongContextAttention.__init__", _long_ctx_init
    )
    patches.on_revert("xfuser.long_ctx_ring_fn", _give_back_ring_fns)
    patches.wrapper(
        "xfuser.cuda_graph_transformer",
        base_pipeline,
        "xFuserPipelineBaseWrapper._convert_transformer_backbone",
        _graph_transformer,
    )


def apply() -> bool:
    """Patch xfuser (already imported); False if it already was."""
    return PATCHES.apply(_build)


def revert() -> None:
    PATCHES.revert()
    _announced.clear()


on_import = post_import_hook("xfuser")
