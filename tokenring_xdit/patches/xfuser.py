"""xfuser patch set: TokenRing as xDiT's ring, chosen by flag, environment or Python call.

Applied once `xfuser` has finished importing, all or nothing; the points are listed in table.py.
The ring dispatcher keeps xDiT's own ring unless TokenRing is selected (see selection.py), so
installing the package changes nothing until a user asks for TokenRing.
"""

from __future__ import annotations

import logging
import weakref

from .. import config
from ..hosts import selection, traced_choice
from .base import PatchSet, post_import_hook
from .table import XFUSER_VERSIONS

PATCHES = PatchSet("xfuser", XFUSER_VERSIONS)

# A child of xDiT's logger, so the line appears in xDiT's own log format and level.
log = logging.getLogger("xfuser.tokenring_xdit")
_announced = selection.announced()  # implementations, and `auto`'s signatures, announced
HOST_RING = "xDiT's own ring"


def _announce(impl: str, source: str, call, decision) -> None:
    """Say once per process, on global rank 0, which ring xDiT runs (`auto`: per signature)."""
    if call is not None:
        selection.log_once(log, _announced, call, selection.describe(call, decision, HOST_RING))
        return
    what = "TokenRing (tokenring_xdit)" if impl == selection.TOKEN_RING else HOST_RING
    selection.log_once(log, _announced, impl, f"ring attention: {what}, selected by {source}")


def _resolve(signature, args, kwargs) -> str:
    """TOKEN_RING or DEFAULT for this call, agreed across the ring before either ring runs;
    `auto` asks the planner once per call signature."""
    group, query, call = signature(*args, **kwargs)
    return traced_choice.choose(group, query, call.q_len, call.kv_len, lambda *_: call, _announce)


def _usp_call(
    attention_function,
    query,
    key,
    value,
    dropout_p=0.0,
    is_causal=False,
    joint_attn_kwargs=None,
    attention_kwargs=None,
) -> tuple:
    """(ring group, query, `auto`'s signature) of a `usp.ring_attn` call (same parameters):
    (b, h, s, d) shards of equal length on every ring rank (both rings need that), heads
    already split by ulysses."""
    import torch.distributed as dist
    from yunchang.globals import PROCESS_GROUP

    from ..hosts.xdit import usp_refusals

    ring = dist.get_world_size(PROCESS_GROUP.RING_PG)
    b, h, s, d = query.shape
    joint = 0 if joint_attn_kwargs is None else joint_attn_kwargs["joint_key"].shape[2]
    refused = selection.refused_names(usp_refusals(dropout_p, is_causal, attention_kwargs))
    # every query meets the joint K/V once: as K/V per rank, 1/ring of it each
    kv_len = key.shape[2] + -(-joint // ring)
    call = selection.ring_call(query, b, h, d, s, kv_len, ring, refused, key.shape[1])
    return PROCESS_GROUP.RING_PG, query, call


def _ring_attn_dispatch(wrapped, instance, args, kwargs):
    if _resolve(_usp_call, args, kwargs) == selection.TOKEN_RING:
        from ..hosts.xdit import usp_ring_attn

        return usp_ring_attn(*args, **kwargs)
    return wrapped(*args, **kwargs)


def _kv_cache_passthrough(wrapped, instance, args, kwargs):
    """USP's `_update_and_get_kv_cache(key, value, attn_layer)`: K/V as they are where that
    step would only copy them (see _kv_cache_only_copies), xDiT's step otherwise."""
    attn_layer = args[2] if len(args) > 2 else kwargs["attn_layer"]
    if _kv_cache_only_copies(attn_layer):
        key, value = args[:2] if len(args) > 1 else (kwargs["key"], kwargs["value"])
        return key, value
    return wrapped(*args, **kwargs)


def _kv_cache_only_copies(attn_layer) -> bool:
    """TokenRing is the selected ring (explicitly: `auto` may still run xDiT's ring, which sends
    K/V and wants them contiguous), the ring degree is > 1, and the layer's cache is one of
    xDiT's two kinds with one pipeline patch (no PipeFusion), where the update returns the new
    K/V unchanged and nothing ever reads what it keeps (xfuser 0.7 CacheManager): the step is
    a cat and two copies. Every input is the same on every rank: the ranks take one branch."""
    if selection.xdit_ring_impl()[0] != selection.TOKEN_RING:
        return False
    from xfuser.core.cache_manager.cache_manager import get_cache_manager
    from xfuser.core.distributed import get_ring_parallel_world_size
    from xfuser.core.distributed.runtime_state import (
        get_runtime_state,
        runtime_state_is_initialized,
    )

    entry = get_cache_manager().cache.get(("attn", attn_layer))
    if entry is None or entry.cache_type not in ("sequence_parallel_attn_cache", "naive_cache"):
        return False
    if get_ring_parallel_world_size() < 2:
        return False
    return not runtime_state_is_initialized() or get_runtime_state().num_pipeline_patch == 1


def _add_flag(wrapped, instance, args, kwargs):
    parser = wrapped(*args, **kwargs)
    target = parser if parser is not None else (args[0] if args else kwargs["parser"])
    target.add_argument(
        "--ring_impl_type",
        type=str,
        default=None,
        choices=list(config.RING_IMPLS),
        help="Ring attention of the ring dimension: 'default' (xDiT's own), 'token_ring' "
        "(TokenRing, from tokenring_xdit) or 'auto' (per call shape, the faster of the two by "
        f"tokenring_xdit's cost model). Overrides ${selection.RING_IMPL_ENV}.",
    )
    return parser


def _read_flag(wrapped, instance, args, kwargs):
    """from_cli_args gets an argparse Namespace, from_runner_args a dict."""
    options = args[0] if args else kwargs["args"]
    if isinstance(options, dict):
        selection.set_from_flag(options.get("ring_impl_type"))
    else:
        selection.set_from_flag(getattr(options, "ring_impl_type", None))
    return wrapped(*args, **kwargs)


def _long_ctx_init(wrapped, instance, args, kwargs):
    """After xFuserLongContextAttention picks its ring function, take over when selected."""
    wrapped(*args, **kwargs)
    import inspect

    requested = inspect.signature(wrapped).bind(*args, **kwargs).arguments.get("ring_impl_type")
    selected = selection.xdit_ring_impl()[0]
    if requested == selection.TOKEN_RING:  # chosen in code, like any yunchang ring type
        from ..hosts.xdit import long_ctx_ring_attn

        _TAKEN_OVER.take(instance, long_ctx_ring_attn)
    elif selected in (selection.TOKEN_RING, selection.AUTO):
        _TAKEN_OVER.take(instance, _dispatching_long_ctx(instance.ring_attn_fn))


def _dispatching_long_ctx(own_ring_fn):
    """A ring function that runs TokenRing or xDiT's `own_ring_fn`, per call, as the ranks
    agree (the process-wide choice can change after the layer was built)."""
    import functools

    from ..hosts.xdit import long_ctx_ring_attn

    @functools.wraps(long_ctx_ring_attn)
    def ring_fn(*args, **kwargs):
        impl = _resolve(_long_ctx_call, args, kwargs)
        chosen = long_ctx_ring_attn if impl == selection.TOKEN_RING else own_ring_fn
        return chosen(*args, **kwargs)

    return ring_fn


def _long_ctx_call(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    group=None,
    attn_type=None,
    attn_processor=None,
    attn_layer=None,
    joint_tensor_key=None,
    joint_tensor_value=None,
    joint_strategy="none",
    q_descale=None,
    k_descale=None,
    v_descale=None,
) -> tuple:
    """(ring group, query, `auto`'s signature) of a long-context ring call (the parameters of
    long_ctx_ring_attn): (b, s, h, d), K/V before any PipeFusion cache (the cached length is
    known only inside the ring function; the uncached one is equal on every rank)."""
    import torch.distributed as dist

    from ..hosts.xdit import ring_fn_refusals

    ring = dist.get_world_size(group)
    b, s, h, d = q.shape
    joint = 0 if joint_tensor_key is None else joint_tensor_key.shape[1]
    refused = selection.refused_names(ring_fn_refusals(
        dropout_p, causal, window_size, alibi_slopes, q_descale, k_descale, v_descale
    ))  # fmt: skip
    kv_len = k.shape[1] + -(-joint // ring)
    call = selection.ring_call(q, b, h, d, s, kv_len, ring, refused, k.shape[2])  # GQA: K/V heads
    return group, q, call


class _TakenOver:
    """xFuserLongContextAttention layers whose ring function we replaced -> the one xDiT chose
    (weak: at most the live layers); give_back() is the patch's revert."""

    def __init__(self) -> None:
        self._layers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def take(self, layer, ring_fn) -> None:
        self._layers[layer] = layer.ring_attn_fn
        layer.ring_attn_fn = ring_fn

    def give_back(self) -> None:
        """Uninstall: layers built while patched run xDiT's own ring function again."""
        for layer, original in list(self._layers.items()):
            layer.ring_attn_fn = original
        self._layers.clear()


_TAKEN_OVER = _TakenOver()


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

    # runs inside compiled transformers (--use_torch_compile): a wrapper Dynamo can see
    patches.traced_wrapper("xfuser.usp_ring_attn", usp, "ring_attn", _ring_attn_dispatch)
    patches.traced_wrapper(
        "xfuser.usp_kv_passthrough", usp, "_update_and_get_kv_cache", _kv_cache_passthrough
    )
    for name in ("add_cli_args", "add_runner_args"):
        patches.wrapper("xfuser.ring_impl_flag", args_module, f"xFuserArgs.{name}", _add_flag)
    for name in ("from_cli_args", "from_runner_args"):
        patches.wrapper("xfuser.ring_impl_flag_read", args_module, f"xFuserArgs.{name}", _read_flag)
    cls = long_ctx.xFuserLongContextAttention
    patches.list_entry(
        "xfuser.long_ctx_kv_cache", cls.ring_impl_type_supported_kv_cache, selection.TOKEN_RING
    )
    patches.wrapper(
        "xfuser.long_ctx_ring_fn", long_ctx, "xFuserLongContextAttention.__init__", _long_ctx_init
    )
    patches.on_revert("xfuser.long_ctx_ring_fn", _TAKEN_OVER.give_back)
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


on_import = post_import_hook("xfuser", apply)
