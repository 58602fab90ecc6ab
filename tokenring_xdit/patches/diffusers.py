"""diffusers patch set: TokenRing as the ring of diffusers' native context parallelism.

Two reversible wrappers (rows `diffusers.*` in table.py), applied together once
`diffusers.models.attention_dispatch` is imported (`import diffusers` alone loads no model code;
every model with a `_cp_plan` imports attention_dispatch, which imports `_modeling_parallel`):

- `_templated_context_parallel_attention`, the one function every CP-capable backend calls (a
  module global looked up at call time): when TokenRing is selected and the config has a ring
  (ring_degree > 1), its ring runs as TokenRing (hosts/diffusers.py); otherwise, and for causal or
  GQA calls (which diffusers refuses itself), diffusers' own code runs untouched.
- `ContextParallelConfig.setup`, where diffusers derives the ring and ulysses meshes: it runs on
  every rank, in the same order, for both `enable_parallelism` and `from_pretrained(...,
  parallel_config=...)`, so TokenRing's communicators are made there by the ring's members,
  right after the ring group exists (only when TokenRing is selected at that moment; otherwise
  the first TokenRing call makes them, and a run that keeps diffusers' ring makes none).
"""

from __future__ import annotations

import inspect
import logging
from types import ModuleType

from ..hosts import selection, traced_choice
from .base import PatchSet, UnsupportedHostVersion, apply_from_hook
from .table import DIFFUSERS_VERSIONS

PATCHES = PatchSet("diffusers", DIFFUSERS_VERSIONS)
ATTENTION_DISPATCH = "diffusers.models.attention_dispatch"

# A child of diffusers' logger: the line follows diffusers' own format and verbosity.
log = logging.getLogger("diffusers.tokenring_xdit")
_announced = selection.announced()  # implementations, and `auto`'s signatures, announced
HOST_RING = "diffusers' own ring"

_SETUP_PARAMS = ("self", "rank", "world_size", "device", "mesh")


def _cp_arguments(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    enable_gqa=False,
    return_lse=False,
    *,
    forward_op,
    backward_op,
    _parallel_config=None,
) -> dict:
    """diffusers' arguments by name (same signature as the wrapped function, checked at apply)."""
    return locals()


_CP_PARAMS = tuple(inspect.signature(_cp_arguments).parameters)


def _announce(impl: str, source: str, call, decision) -> None:
    """Say once per process, on global rank 0, which ring diffusers runs (`auto`: per call
    signature)."""
    if call is not None:
        message = "context-parallel " + selection.describe(call, decision, HOST_RING)
        selection.log_once(log, _announced, call, message)
        return
    what = "TokenRing (tokenring_xdit)" if impl == selection.TOKEN_RING else "diffusers' own"
    message = f"context-parallel ring attention: {what}, selected by {source}"
    selection.log_once(log, _announced, impl, message)


def _resolve(call: dict, cp) -> str:
    """TOKEN_RING or DEFAULT for this call, agreed across the ring before either ring runs;
    `auto` asks the planner once per call signature, with the ring's longest shard (under
    ring_anything the ranks' lengths differ; the all-gather ring pads to the longest too)."""
    query, key = call["query"], call["key"]
    b, s, h, d = query.shape
    u = cp.ulysses_degree

    def signature(q_len: int, kv_len: int) -> selection.AutoSignature:
        # the ring's view of this (b, s, h, d) call, after ulysses (heads / u, sequence x u)
        refused = _refusal(call)
        return selection.ring_call(query, b, h // u, d, q_len, kv_len, cp.ring_degree, refused)

    group = cp._ring_mesh.get_group()
    return traced_choice.choose(group, query, s * u, key.shape[1] * u, signature, _announce)


def _refusal(call: dict) -> str:
    """What TokenRing does not run under diffusers (hosts/diffusers.py lists it): `auto` keeps
    diffusers' ring for it (the same answer on every rank of a CP model)."""
    from ..hosts.diffusers import cp_refusals

    refusals = cp_refusals(
        call["query"], call["key"], call["value"], call["attn_mask"], call["dropout_p"],
        call["is_causal"], call["enable_gqa"],
    )  # fmt: skip
    return selection.refused_names(refusals)


def _cp_dispatch(wrapped, instance, args, kwargs):
    call = _cp_arguments(*args, **kwargs)
    config = call["_parallel_config"]
    cp = getattr(config, "context_parallel_config", None)
    if cp is None or cp.ring_degree <= 1:  # ulysses only: there is no ring to replace
        return wrapped(*args, **kwargs)
    impl = _resolve(call, cp)
    if impl != selection.TOKEN_RING or call["is_causal"] or call["enable_gqa"]:
        return wrapped(*args, **kwargs)
    from ..hosts.diffusers import context_parallel_attention

    return context_parallel_attention(
        call["query"],
        call["key"],
        call["value"],
        call["attn_mask"],
        call["dropout_p"],
        call["scale"],
        call["return_lse"],
        call["forward_op"],
        config,
    )


def _setup_after(wrapped, instance, args, kwargs):
    """ContextParallelConfig.setup, then TokenRing's communicators for the ring group (made
    now rather than at the first attention call; only when TokenRing is selected)."""
    result = wrapped(*args, **kwargs)
    if instance.ring_degree > 1 and selection.xdit_ring_impl()[0] == selection.TOKEN_RING:
        from ..ring.comm import setup_token_ring_group

        setup_token_ring_group(instance._ring_mesh.get_group())
    return result


def _check_parameters(func, expected: tuple[str, ...]) -> None:
    names = tuple(inspect.signature(func).parameters)
    if names != expected:
        raise UnsupportedHostVersion(
            f"diffusers' {func.__qualname__} takes {names}, not the {expected} tokenring_xdit "
            "was written against; nothing of diffusers was patched. Use a tested diffusers "
            "(0.42.1) or a newer tokenring-xdit."
        )


def _build(patches: PatchSet) -> None:
    import diffusers.models._modeling_parallel as modeling_parallel
    import diffusers.models.attention_dispatch as attention_dispatch

    _check_parameters(attention_dispatch._templated_context_parallel_attention, _CP_PARAMS)
    _check_parameters(modeling_parallel.ContextParallelConfig.setup, _SETUP_PARAMS)
    patches.traced_wrapper(  # runs inside compiled models: a wrapper Dynamo can see
        "diffusers.cp_ring",
        attention_dispatch,
        "_templated_context_parallel_attention",
        _cp_dispatch,
    )
    patches.wrapper(
        "diffusers.cp_setup", modeling_parallel, "ContextParallelConfig.setup", _setup_after
    )


def apply() -> bool:
    """Patch diffusers (imports its attention dispatcher); False if it already was."""
    return PATCHES.apply(_build)


def revert() -> None:
    PATCHES.revert()
    _announced.clear()


def on_import(module: ModuleType) -> None:
    """Post-import hook (entry point `diffusers`): wait for the attention dispatcher, so that
    `import diffusers` stays as lazy as diffusers made it."""
    import wrapt

    wrapt.register_post_import_hook(_on_attention_dispatch, ATTENTION_DISPATCH)


def _on_attention_dispatch(module: ModuleType) -> None:
    apply_from_hook("diffusers", apply)
