"""Opt-in CPU mode for diffusers' context parallelism (gloo): for tests and development.

What breaks on CPU (diffusers 0.42.1, a CPU build of torch or a CUDA build without a GPU) and
what each shim changes are the patch table's rows `diffusers_cpu.*` (docs/diffusers.md shows
them): the device index without an accelerator, a CPU forward op with an lse for
`_native_flash`, a clear refusal of its CUDA-only backward, the length exchange's device, and
gloo's equal-size all_gather under `ring_anything`. Everything else of diffusers' CP runs on gloo
as is. `enable()` applies the shims once `diffusers.models.attention_dispatch` is imported (at
once if it is); `disable()` reverts them. They are separate from the TokenRing patches:
`tokenring_xdit.uninstall()` leaves them alone.
"""

from __future__ import annotations

import sys

from .base import PatchSet, Switch
from .table import DIFFUSERS_CPU_VERSIONS

PATCHES = PatchSet("diffusers", DIFFUSERS_CPU_VERSIONS)
_SWITCH = Switch()


def _no_accelerator() -> bool:
    # By device, not build: a CUDA build on a GPU-less machine reports the `cuda` accelerator
    # with 0 devices, which is the same ZeroDivisionError as a CPU build's None.
    import torch

    return torch.accelerator.current_accelerator() is None or torch.accelerator.device_count() == 0


def _one_device(wrapped, instance, args, kwargs):
    if not _no_accelerator():
        return wrapped(*args, **kwargs)
    import torch

    count = torch.accelerator.device_count
    torch.accelerator.device_count = lambda: 1
    try:
        return wrapped(*args, **kwargs)
    finally:
        torch.accelerator.device_count = count


def _forward_arguments(
    ctx,
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    enable_gqa=False,
    return_lse=False,
    _save_ctx=True,
    _parallel_config=None,
) -> dict:
    return locals()


def _cpu_flash_forward(wrapped, instance, args, kwargs):
    call = _forward_arguments(*args, **kwargs)
    if call["query"].device.type != "cpu":
        return wrapped(*args, **kwargs)
    import torch

    if call["attn_mask"] is not None or call["enable_gqa"]:
        raise ValueError("diffusers' CPU mode: _native_flash takes no attn_mask and no GQA")
    if call["_save_ctx"] and any(call[n].requires_grad for n in ("query", "key", "value")):
        _forward_only()  # diffusers' ring/ulysses backward would find nothing saved
    q, k, v = (call[n].transpose(1, 2) for n in ("query", "key", "value"))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, call["dropout_p"], call["is_causal"], scale=call["scale"]
    )[:2]
    # model layout, as the CUDA op's callers expect: out (b, s, h, d), lse (b, s, h)
    out, lse = out.transpose(1, 2).contiguous(), lse.transpose(1, 2).contiguous()
    return (out, lse) if call["return_lse"] else out


def _cpu_flash_backward(wrapped, instance, args, kwargs):
    grad_out = args[1] if len(args) > 1 else kwargs.get("grad_out")
    if grad_out is not None and grad_out.device.type == "cpu":
        _forward_only()
    return wrapped(*args, **kwargs)


def _forward_only():
    raise NotImplementedError(
        "diffusers' CPU mode (tokenring_xdit.patches.diffusers_cpu) is forward-only for "
        "diffusers' own context-parallel attention: run under torch.no_grad() / "
        "torch.inference_mode(), or select TokenRing (TOKENRING_XDIT_RING_IMPL=token_ring), "
        "whose training path runs on CPU"
    )


def _gloo_gather_anything(wrapped, instance, args, kwargs):
    tensor, dim, group = _gather_arguments(*args, **kwargs)
    import torch
    import torch.distributed as dist

    if tensor.device.type != "cpu" or "gloo" not in str(dist.get_backend(group)):
        return wrapped(*args, **kwargs)
    from diffusers.models._modeling_parallel import gather_size_by_comm

    lengths = gather_size_by_comm(tensor.shape[dim], group)
    shape = list(tensor.shape)
    shape[dim] = max(lengths) - tensor.shape[dim]
    padded = torch.cat([tensor, tensor.new_zeros(shape)], dim=dim).contiguous()
    pieces = [torch.empty_like(padded) for _ in lengths]
    dist.all_gather(pieces, padded, group=group)
    return torch.cat([p.narrow(dim, 0, n) for p, n in zip(pieces, lengths, strict=True)], dim=dim)


def _gather_arguments(tensor, dim, group):
    return tensor, dim, group


def _cpu_sizes(wrapped, instance, args, kwargs):
    if not _no_accelerator():
        return wrapped(*args, **kwargs)
    size, group = _size_arguments(*args, **kwargs)
    import torch
    import torch.distributed as dist

    sizes = [torch.empty(1, dtype=torch.int64) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, torch.tensor([size], dtype=torch.int64), group=group)
    return [int(s[0]) for s in sizes]


def _size_arguments(size, group):
    return size, group


def _build(patches: PatchSet) -> None:
    import diffusers.hooks.context_parallel as context_parallel
    import diffusers.models._modeling_parallel as parallel
    import diffusers.models.attention_dispatch as attention_dispatch
    import diffusers.models.modeling_utils as modeling_utils

    if hasattr(modeling_utils.ModelMixin, "_resolve_parallel_config"):  # diffusers >= 0.42
        patches.wrapper(
            "diffusers_cpu.device_index",
            modeling_utils,
            "ModelMixin._resolve_parallel_config",
            _one_device,
        )
    patches.traced_wrapper(
        "diffusers_cpu.native_flash_forward",
        attention_dispatch,
        "_native_flash_attention_forward_op",
        _cpu_flash_forward,
    )
    patches.traced_wrapper(
        "diffusers_cpu.native_flash_backward",
        attention_dispatch,
        "_native_flash_attention_backward_op",
        _cpu_flash_backward,
    )
    if hasattr(parallel, "gather_size_by_comm"):  # diffusers >= 0.42
        original = parallel.gather_size_by_comm
        handle = patches.wrapper(
            "diffusers_cpu.gather_sizes", parallel, "gather_size_by_comm", _cpu_sizes
        )
        for alias_owner in (attention_dispatch, context_parallel):
            patches.rebind(
                "diffusers_cpu.gather_sizes", alias_owner, "gather_size_by_comm", original, handle
            )
    patches.wrapper(
        "diffusers_cpu.gather_anything",
        context_parallel,
        "_all_gather_anything",
        _gloo_gather_anything,
    )


def _on_attention_dispatch(module) -> None:
    if _SWITCH.enabled:
        PATCHES.apply(_build)


def enable() -> list[str]:
    """Switch CPU mode on (idempotent); returns the ids applied so far (none until diffusers'
    attention dispatcher is imported)."""
    _SWITCH.enabled = True
    if "diffusers.models.attention_dispatch" in sys.modules:
        PATCHES.apply(_build)
    elif not _SWITCH.armed:
        import wrapt

        _SWITCH.armed = True
        wrapt.register_post_import_hook(
            _on_attention_dispatch, "diffusers.models.attention_dispatch"
        )
    return list(PATCHES.applied)


def disable() -> None:
    """Revert every CPU shim; hooks not yet fired apply nothing. Idempotent."""
    _SWITCH.enabled = False
    PATCHES.revert()


def applied() -> list[str]:
    """Patch-set protocol (patches/__init__): the ids applied now."""
    return list(PATCHES.applied)


def revert() -> None:
    """Patch-set protocol: undo everything (uninstall)."""
    disable()
