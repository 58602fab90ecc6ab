"""Input checks that fail on every rank of the ring instead of hanging one of them.

Local problems are encoded as a code and exchanged with the ring's shapes in one small
all-gather, so every rank raises the same error. The exchange runs once per new input signature
(the ring lengths it returns are cached); TOKENRING_XDIT_VALIDATE=always repeats it every call,
which also catches ranks whose inputs change out of step with each other (one rank's query
length changing while the others' stay the same needs it: the others must size their buffers).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .comm import COUNTERS, RingPosition
from .layout import Layout

_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)

_PROBLEMS = {
    1: "q, k and v must be 4-d tensors in the {layout} layout",
    2: "q, k and v must share one floating dtype (float32, float16, bfloat16 or float64)",
    3: "k and v must match q in batch size and head count (GQA is not supported)",
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
}
_META_LEN = 12
_Q_LEN, _KV_LEN = 5, 6  # slots of the exchanged header (see _meta)


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


def _local_problem(q, k, v, layout: Layout, causal: bool, joint_kv=None) -> int:
    if any(x.dim() != 4 for x in (q, k, v)):
        return 1
    if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return 2
    if not q.device == k.device == v.device:
        return 7
    (b, _, h, d), (bk, sk, hk, dk), (bv, sv, hv, _) = (layout.dims(x) for x in (q, k, v))
    if (bk, hk) != (b, h) or (bv, hv) != (b, h):
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


def _meta(q, k, v, layout: Layout, causal: bool, chunks: int, problem: int) -> list[int]:
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
        q.device.type == "cuda",
    ]


def _exchange(group: dist.ProcessGroup, meta: list[int], device: torch.device) -> list[list[int]]:
    if dist.get_backend(group) == "gloo":
        device = torch.device("cpu")
    mine = torch.tensor(meta, dtype=torch.int64, device=device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, mine, group=group)
    COUNTERS.handshakes += 1
    return torch.stack(everyone).tolist()


def _raise_for(metas: list[list[int]], rank: int, layout: Layout) -> None:
    bad = [(r, m[0]) for r, m in enumerate(metas) if m[0]]
    if bad:
        lines = [f"rank {r}: {_PROBLEMS[c].format(layout=layout.name)}" for r, c in bad]
        kind = NotImplementedError if all(c in (6, 8) for _, c in bad) else ValueError
        raise kind(
            "TokenRing input rejected on ring rank(s) {}:\n  {}".format(
                [r for r, _ in bad], "\n  ".join(lines)
            )
        )
    names = ("batch size", "head count", "head size", "value head size")
    for i, name in enumerate(names, start=1):
        values = [m[i] for m in metas]
        if len(set(values)) > 1:
            raise ValueError(f"TokenRing: {name} differs across ring ranks: {values}")
    for i, name in (
        (7, "dtype"),
        (8, "layout"),
        (9, "causal flag / gradient mode (1 causal, 2 requires grad)"),
        (10, "final_chunks"),
        (11, "device type"),
    ):
        values = [m[i] for m in metas]
        if len(set(values)) > 1:
            raise ValueError(f"TokenRing: {name} differs across ring ranks: {values}")


_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 256


def check_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: Layout,
    causal: bool,
    chunks: int,
    position: RingPosition,
    joint_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    always: bool = False,
) -> RingShapes:
    """Validate q/k/v on every ring rank at once and return every rank's local query lengths.

    always: exchange even for a signature seen before (ranks whose lengths change out of step).
    """
    problem = _local_problem(q, k, v, layout, causal, joint_kv) or (10 if chunks < 1 else 0)
    if not problem and causal and position.size > 1 and q.shape[layout.seq_dim] % 2:
        problem = 6  # a zigzag shard is two equal halves
    meta = _meta(q, k, v, layout, causal, chunks, problem)
    if position.size == 1:
        _raise_for([meta], 0, layout)
        return RingShapes((meta[_Q_LEN],))
    # Our K/V length is nobody else's business (K/V never move), so a KV cache growing on one
    # rank must not send that rank alone into the exchange: leave it out of the key.
    key = (position.group, tuple(meta[:_KV_LEN] + meta[_KV_LEN + 1 :]), q.device)
    if not always and problem == 0 and key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    metas = _exchange(position.group, meta, q.device)
    _raise_for(metas, position.rank, layout)
    shapes = RingShapes(tuple(m[_Q_LEN] for m in metas))
    _CACHE[key] = shapes
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return shapes
