"""yunchang patch set: ring_impl_type="token_ring" and TokenRing's extra communicators.

Applied once `yunchang` has finished importing (so every submodule and alias exists), all or
nothing; the points are listed in table.py.
"""

from __future__ import annotations

import inspect

from .base import PatchSet, post_import_hook
from .table import YUNCHANG_VERSIONS

RING_IMPL_NAME = "token_ring"
PATCHES = PatchSet("yunchang", YUNCHANG_VERSIONS)


class UnknownRingImplError(ValueError, KeyError):
    """An unknown ring_impl_type (a KeyError too, as yunchang's own lookup raised)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


def _setup_after(wrapped, instance, args, kwargs):
    """set_seq_parallel_pg, then a bounded timeout on the groups it made and TokenRing's
    communicators for the new ring groups.

    yunchang makes its groups without a timeout, so they carry torch's 30-minute default: a rank
    that raised would block its peers (in TokenRing and in yunchang's all-to-all) that long.
    They get the ring deadline instead (TOKENRING_XDIT_TIMEOUT, else the world group's timeout,
    the one the user set), never a longer one."""
    result = wrapped(*args, **kwargs)
    import torch.distributed as dist
    from yunchang.globals import PROCESS_GROUP

    from .. import config
    from ..ring.comm import setup_token_ring_group
    from ..ring.comm.groups import ring_deadline

    set_timeout = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    try:
        comm = config.current().comm  # this hook is an entry: it reads the environment
        for group in (PROCESS_GROUP.ULYSSES_PG, PROCESS_GROUP.RING_PG):
            if set_timeout is not None and group is not None and dist.get_world_size(group) > 1:
                set_timeout(ring_deadline(group, comm.timeout), group)
        setup_token_ring_group(PROCESS_GROUP.RING_PG, comm)
    except ValueError:
        pass  # a bad TOKENRING_XDIT_* value: the first ring call names it, on every rank
    return result


def zigzag_extract_local(value, rank, world_size, rd, ud, dim=1, *args, **kwargs):
    """yunchang's zigzag split (EXTRACT_FUNC_DICT["token_ring"]), refusing lengths it would
    garble. The ring function it feeds passes the zigzag split itself (hosts/yunchang.py)."""
    import yunchang.comm.extract_local as extract_local

    total = value.shape[dim]
    if total % (2 * rd * ud):
        raise ValueError(
            f"a zigzag split of {total} tokens over ring {rd} x ulysses {ud} needs a multiple "
            f"of 2 x {rd} x {ud} = {2 * rd * ud} tokens; pad the sequence"
        )
    return extract_local.zigzag_extract_local(value, rank, world_size, rd, ud, dim, *args, **kwargs)


def _ring_impl_check(registry: dict):
    def check(wrapped, instance, args, kwargs):
        bound = inspect.signature(wrapped).bind(*args, **kwargs)
        name = bound.arguments.get("ring_impl_type", "basic")
        if name not in registry:
            raise UnknownRingImplError(
                f"unknown ring_impl_type {name!r}; valid values: {', '.join(sorted(registry))}"
            )
        return wrapped(*args, **kwargs)

    return check


def _update_npu_out(*args, **kwargs):
    raise NotImplementedError(
        "update_npu_out (xDiT's NPU ring merge) is not part of yunchang 0.6.4; tokenring_xdit "
        "only provides the name so xFuserLongContextAttention imports. Use a yunchang release "
        "that ships it for NPU rings."
    )


def _build(patches: PatchSet) -> None:
    import yunchang
    import yunchang.comm.extract_local as extract_local
    import yunchang.globals as ygl
    import yunchang.hybrid.attn_layer as attn_layer
    import yunchang.hybrid.utils as hybrid_utils
    import yunchang.ring.utils as ring_utils

    from ..hosts.yunchang import token_ring_flash_attn_func, token_ring_flash_attn_qkvpacked_func

    packed = hybrid_utils.RING_IMPL_QKVPACKED_DICT
    for patch_id, registry, value in (
        ("yunchang.ring_impl", hybrid_utils.RING_IMPL_DICT, token_ring_flash_attn_func),
        ("yunchang.ring_impl_qkvpacked", packed, token_ring_flash_attn_qkvpacked_func),
        # zigzag shards (the ring function's contract); non-causal is exact on any
        ("yunchang.extract_local", extract_local.EXTRACT_FUNC_DICT, zigzag_extract_local),
    ):
        patches.registry_entry(patch_id, registry, RING_IMPL_NAME, value)
    original = ygl.set_seq_parallel_pg
    wrapped = patches.wrapper(
        "yunchang.set_seq_parallel_pg", ygl, "set_seq_parallel_pg", _setup_after
    )
    patches.rebind(
        "yunchang.set_seq_parallel_pg", yunchang, "set_seq_parallel_pg", original, wrapped
    )
    for cls, registry in (
        ("LongContextAttention", hybrid_utils.RING_IMPL_DICT),
        ("LongContextAttentionQKVPacked", packed),
    ):
        check = _ring_impl_check(registry)
        patches.wrapper("yunchang.ring_impl_type_check", attn_layer, f"{cls}.__init__", check)
    patches.missing_symbol("yunchang.update_npu_out", ring_utils, "update_npu_out", _update_npu_out)


def apply() -> bool:
    """Patch yunchang; False if it already was."""
    # Import it before building: when the xfuser set is the first to import yunchang (a CUDA
    # build of torch without a GPU: xfuser's own yunchang imports are gated on a device), that
    # import fires the armed post-import hook, which applies this set; building here as well,
    # half-way through the nested apply, would find its registry keys taken.
    import yunchang  # noqa: F401

    return PATCHES.apply(_build)


def revert() -> None:
    PATCHES.revert()


on_import = post_import_hook("yunchang", apply)
