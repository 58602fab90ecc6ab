"""Input checks that fail on every rank of the ring instead of hanging one of them.

Local problems are encoded as a code and exchanged with the ring's shapes, scale and settings in
one fixed-size header (one small all-gather on a CPU communicator, so it never synchronises the
GPU and can precede a CUDA-graph replay). Every rank raises the same error, and no P2P starts
before every rank knows every other's lengths, so a payload never meets a buffer of another size.

When the exchange runs (RingConfig.validate): "always" every call; "signature" only for an input
signature this rank has not seen (the others then must see a new one too, or the ranks wait on
different calls until the timeout, which then names the likely causes); "auto" (default) is
"always" on gloo rings, where the exchange is cheap next to CPU attention, and "signature" on
NCCL rings (docs/performance.md: the measured cost of "always" there).
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .comm import (
    COUNTERS,
    RingPosition,
    TokenRingCommError,
    backend_of,
    check_group_for,
    describe_peer,
    timeout_of,
)
from .layout import Layout

_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)

_PROBLEMS = {
    1: "q, k and v must be 4-d tensors in the {layout} layout",
    2: "q, k and v must share one floating dtype (float32, float16, bfloat16 or float64)",
    3: "k and v must match q in batch size and have one head count that divides q's (GQA/MQA: "
    "q heads = g x K/V heads, query head i uses K/V head i // g)",
    4: "k and v must have the same sequence length",
    5: "q and k must have the same head size",
    6: "causal=True needs zigzag shards: q, k and v of one length per rank, even when the ring "
    "has more than one rank (chunks r and 2N-1-r of 2N equal chunks: use yunchang's "
    "EXTRACT_FUNC_DICT['token_ring'], i.e. zigzag_extract_local), and no joint K/V",
    7: "q, k and v must be on one device",
    8: "gradients through joint K/V are not supported: run joint attention under "
    "torch.no_grad() or torch.inference_mode()",
    9: "joint K/V must be a (key, value) pair of 4-d tensors matching k/v in batch size, "
    "head count, head sizes, dtype and device",
    10: "final_chunks (argument, or TOKENRING_XDIT_FINAL_CHUNKS) must be a positive integer",
    11: "q, k and v must be on the ring backend's device type ({device} for this group), not {got}",
    12: "softmax_scale must be a finite positive number",
}
_NOT_IMPLEMENTED = (6, 8)
_META_LEN = 14
_Q_LEN, _KV_LEN = 5, 6  # slots of the exchanged header (see _meta)
# header slot -> what must be equal on every ring rank
_MUST_AGREE = {
    1: "batch size",
    2: "head count",
    3: "head size",
    4: "value head size",
    7: "dtype",
    8: "layout",
    9: "causal flag / gradient mode (1 causal, 2 requires grad)",
    10: "final_chunks",
    11: "device type",
    12: "softmax_scale",
}
_DEVICE_TYPES = ("cpu", "cuda", "meta", "xpu", "mps", "hpu", "npu", "mtia")


@dataclass(frozen=True)
class RingShapes:
    q_lens: tuple[int, ...]  # local query length of every ring rank


def _joint_problem(k, v, joint_kv, layout: Layout) -> bool:
    try:
        jk, jv = joint_kv
        (b, _, h, d), (jb, sk, jh, jd) = layout.dims(k), layout.dims(jk)
        (_, _, _, dv), (vb, sv, vh, jdv) = layout.dims(v), layout.dims(jv)
    except (TypeError, ValueError, IndexError, AttributeError):
        return True
    return (
        jk.dim() != 4
        or jv.dim() != 4
        or (jb, jh, jd) != (b, h, d)
        or (vb, vh, jdv) != (b, h, dv)
        or sk != sv
        or jk.dtype != k.dtype
        or jv.dtype != k.dtype
        or jk.device != k.device
        or jv.device != k.device
    )


def needs_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """True when autograd will want gradients of this call (the training path runs)."""
    return torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))


def _local_problem(q, k, v, layout: Layout, causal: bool, device_type: str, joint_kv=None) -> int:
    if any(x.dim() != 4 for x in (q, k, v)):
        return 1
    if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return 2
    if not q.device == k.device == v.device:
        return 7
    if device_type != "any" and q.device.type != device_type:
        return 11
    (b, _, h, d), (bk, sk, hk, dk), (bv, sv, hv, _) = (layout.dims(x) for x in (q, k, v))
    if (bk, bv) != (b, b) or hk != hv or not hk or h % hk:
        return 3
    if sk != sv:
        return 4
    if dk != d:
        return 5
    if causal and (sk != layout.dims(q)[1] or joint_kv is not None):
        return 6
    if joint_kv is not None and needs_grad(q, k, v):
        return 8
    if joint_kv is not None and _joint_problem(k, v, joint_kv, layout):
        return 9
    return 0


def _meta(q, k, v, layout, causal: bool, chunks: int, scale: float, problem: int) -> list[int]:
    if problem == 1:
        return [problem] + [-1] * (_META_LEN - 1)
    (b, s, h, d), kv_len, dv = layout.dims(q), k.shape[layout.seq_dim], v.shape[3]
    dtype = _DTYPES.index(q.dtype) if q.dtype in _DTYPES else -1
    return [
        problem,
        b,
        h,
        d,
        dv,
        s,
        kv_len,
        dtype,
        layout.seq_dim,
        int(causal) | 2 * int(needs_grad(q, k, v)),  # both choose the schedule
        chunks,
        _DEVICE_TYPES.index(q.device.type) if q.device.type in _DEVICE_TYPES else -1,
        struct.unpack("<q", struct.pack("<d", scale))[0],  # the exact float, as 64 bits
        0,  # reserved (keeps the header's size fixed for later fields)
    ]


def _exchange(pos: RingPosition, meta: list[int]) -> list[list[int]]:
    group = check_group_for(pos.group)  # CPU: no GPU synchronisation
    mine = torch.tensor(meta, dtype=torch.int64)
    everyone = [torch.empty_like(mine) for _ in range(pos.size)]
    try:
        dist.all_gather(everyone, mine, group=group)
    except RuntimeError as exc:
        raise TokenRingCommError(
            f"TokenRing input check failed on {describe_peer(pos.group, pos.rank)}: a rank of "
            f"the ring (global ranks {dist.get_process_group_ranks(pos.group)}) did not take "
            f"part within {timeout_of(pos.group).total_seconds():.0f} s "
            f"({str(exc).strip().splitlines()[0][:200]}); likely causes: that rank raised or "
            "exited before this call (see its log), called TokenRing fewer times, or passed a "
            "different group"
        ) from exc
    COUNTERS.handshakes += 1
    return torch.stack(everyone).tolist()


def _raise_for(metas: list[list[int]], layout: Layout, device_type: str) -> None:
    bad = [(r, m[0]) for r, m in enumerate(metas) if m[0]]
    if bad:
        lines = [
            f"rank {r}: "
            + _PROBLEMS[c].format(
                layout=layout.name, device=device_type, got=_device_name(metas[r][11])
            )
            for r, c in bad
        ]
        kind = NotImplementedError if all(c in _NOT_IMPLEMENTED for _, c in bad) else ValueError
        raise kind(
            "TokenRing input rejected on ring rank(s) {}:\n  {}".format(
                [r for r, _ in bad], "\n  ".join(lines)
            )
        )
    for i, name in _MUST_AGREE.items():
        values = [m[i] for m in metas]
        if len(set(values)) > 1:
            if i == 12:
                values = [struct.unpack("<d", struct.pack("<q", x))[0] for x in values]
            raise ValueError(f"TokenRing: {name} differs across ring ranks: {values}")


def _device_name(index: int) -> str:
    return _DEVICE_TYPES[index] if 0 <= index < len(_DEVICE_TYPES) else "another device type"


_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 256


def check_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: Layout,
    causal: bool,
    chunks: int,
    scale: float,
    position: RingPosition,
    joint_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    validate: str = "auto",
) -> RingShapes:
    """Validate q/k/v on every ring rank at once and return every rank's local query lengths.

    validate: "always", "signature" or "auto" (see the module docstring).
    """
    device_type = _ring_device_type(position)
    problem = _local_problem(q, k, v, layout, causal, device_type, joint_kv)
    if not problem and chunks < 1:
        problem = 10
    if not problem and not (scale > 0 and scale != float("inf")):
        problem = 12
    if not problem and causal and position.size > 1 and q.shape[layout.seq_dim] % 2:
        problem = 6  # a zigzag shard is two equal halves
    meta = _meta(q, k, v, layout, causal, chunks, scale, problem)
    if position.size == 1:
        _raise_for([meta], layout, device_type)
        return RingShapes((meta[_Q_LEN],))
    always = validate == "always" or (validate == "auto" and device_type == "cpu")
    # Our K/V length is nobody else's business (K/V never move), so a KV cache growing on one
    # rank must not send that rank alone into the exchange: leave it out of the key.
    key = (position.group, tuple(meta[:_KV_LEN] + meta[_KV_LEN + 1 :]), q.device)
    if not always and problem == 0 and key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    metas = _exchange(position, meta)
    _raise_for(metas, layout, device_type)
    shapes = RingShapes(tuple(m[_Q_LEN] for m in metas))
    _CACHE[key] = shapes
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return shapes


def _ring_device_type(position: RingPosition) -> str:
    """The device type the ring's backend moves: cpu for gloo, cuda for NCCL (and others)."""
    if position.size == 1:
        return "any"  # nothing moves
    return "cpu" if backend_of(position.group) == "gloo" else "cuda"
