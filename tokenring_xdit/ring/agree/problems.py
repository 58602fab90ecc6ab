"""What can be wrong with one TokenRing call, found on one rank before any transfer.

Each `Problem` travels as its code in the header's problem slot (the codes are the wire format:
never renumber one); every rank then formats the same message. Problems that ask for something
TokenRing does not implement raise NotImplementedError, the others ValueError.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import torch

from ..split.value import Split
from ..tensor_layout import Layout

__all__ = ["Problem", "CallSpec", "needs_grad", "local_problem"]


class Problem(IntEnum):
    """A rejected call: its wire code, its message (formatted with the call's words) and whether
    it is a missing feature (NotImplementedError) rather than bad input (ValueError)."""

    message: str
    not_implemented: bool

    def __new__(cls, code: int, message: str, not_implemented: bool = False):
        member = int.__new__(cls, code)
        member._value_ = code
        member.message = message
        member.not_implemented = not_implemented
        return member

    NONE = 0, ""
    NOT_4D = 1, "q, k and v must be 4-d tensors in the {layout} layout"
    DTYPE = 2, "q, k and v must share one floating dtype (float32, float16, bfloat16 or float64)"
    HEADS = (
        3,
        (
            "k and v must match q in batch size and have one head count that divides q's (GQA/MQA: "
            "q heads = g x K/V heads, query head i uses K/V head i // g)"
        ),
    )
    KV_LENGTH = 4, "k and v must have the same sequence length"
    HEAD_SIZE = 5, "q and k must have the same head size"
    NOT_ZIGZAG = (
        6,
        (
            "causal=True needs zigzag shards: q, k and v of one even length (two equal halves, "
            "chunks r and 2N-1-r of 2N equal chunks), the same length on every rank, and no joint "
            "K/V. Cut them with tokenring_xdit.shard(x, group, split=split) (split = "
            "tokenring_xdit.make_split(S, N, causal=True)) or yunchang's "
            "EXTRACT_FUNC_DICT['token_ring'], on a sequence whose length divides by 2N (pad it)"
        ),
        True,
    )
    DEVICES = 7, "q, k and v must be on one device"
    JOINT_GRAD = (
        8,
        (
            "gradients through joint K/V are not supported: run joint attention under "
            "torch.no_grad() or torch.inference_mode()"
        ),
        True,
    )
    JOINT_KV = (
        9,
        (
            "joint K/V must be a (key, value) pair of 4-d tensors matching k/v in batch size, "
            "head count, head sizes, dtype and device"
        ),
    )
    FINAL_CHUNKS = (
        10,
        ("final_chunks (argument, or TOKENRING_XDIT_FINAL_CHUNKS) must be a positive integer"),
    )
    DEVICE_TYPE = (
        11,
        (
            "q, k and v must be on the device type this ring's transport moves ({device} for this "
            "group and TOKENRING_XDIT_TRANSPORT), not {got}{hint}"
        ),
    )
    SCALE = 12, "softmax_scale must be a finite positive number"
    KERNEL_UNUSABLE = 13, "the kernel cannot be used: {detail}"
    BAD_POSITIONS = (
        14,
        (
            "causal=True: `positions` are not this rank's {detail} positions (zigzag: rank r holds "
            "chunks r and 2N-1-r of 2N equal chunks); cut the shards with "
            "tokenring_xdit.shard(x, group, split=split), whose positions are "
            "tokenring_xdit.shard_positions(split, rank)"
        ),
    )
    NO_PROOF = (
        15,
        (
            "causal=True needs proof that the shards are zigzag shards (contiguous shards give "
            "wrong results silently): pass the split they were cut by as split= (split = "
            "tokenring_xdit.make_split(S, N, causal=True); q = tokenring_xdit.shard(q, group, "
            "split=split)), or the shard's global token positions as positions=; yunchang's "
            "ring_impl_type='token_ring' passes its zigzag split itself"
        ),
    )
    KERNEL_UNSUPPORTED = 16, "the kernel does not support this call: {detail}", True
    CU_SEQLENS = 17, "cu_seqlens are not usable: {detail}"
    PACKED_SHAPE = (
        18,
        (
            "packed documents (cu_seqlens / position_ids) need k and v of the query's length (the "
            "same tokens), no joint K/V, and one document layout for the whole batch (pack every "
            "document into one row, batch size 1)"
        ),
    )
    POSITION_IDS = (
        19,
        (
            "position_ids (packed, restarting at 0 per document) must be (s,) or (b, s) with equal "
            "rows for this rank's s queries, count up by one inside a document and restart at 0 "
            "where one starts; or pass cu_seqlens of the whole sequence"
        ),
    )
    SPLIT = 20, "the split does not fit this call: {detail}"
    OPTION = 23, "{detail}"  # an agreed option's value refused (seam/prepare.py words it)
    # (21 and 22 were the proofs of packed layouts: a `Split` carries its proof)


@dataclass(frozen=True, kw_only=True)
class CallSpec:
    """What this rank asks of one TokenRing call (seam/prepare.py builds it)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    layout: Layout
    causal: bool
    chunks: int
    scale: float
    kernel: int  # digest of the kernel family
    graphs: bool | None  # None: `auto` training graphs, decided after the agreement
    validate: str
    joint_kv: tuple[torch.Tensor, torch.Tensor] | None = None
    grad: bool = False  # autograd wants gradients (the header's mode; prepare decides it)
    train: bool = False  # the block-schedule path: causal, gradients, packed or a window
    split: Split = Split()  # how the sequence is cut (its documents, or those of doc_positions)
    doc_positions: torch.Tensor | None = None  # packed: this rank's position ids that restart
    problem: Problem = Problem.NONE  # found before the check (the kernel's, the documents')
    detail: str = ""
    transport: str = "nccl"  # requested (config.TRANSPORTS); the agreed one is Ring.transport
    timeout: float | None = None  # this call's deadline in seconds (RingConfig.timeout)
    family: object = None  # the kernel family (`kernel` is its agreed digest; errors name it)
    # ((name, value), ...) of the options declared agreed (seam/prepare.py AGREED): the header
    # carries their digest, an error names the one that differs
    agreed: tuple = ()

    @property
    def kernel_name(self) -> str:
        """The kernel family as a user would name it (error path only: not worded per call)."""
        f = self.family
        if isinstance(f, tuple) and len(f) == 3 and f[0] == "pair":
            return f"{f[1]} (training pair{', deterministic' if f[2] else ''})"
        return "" if f is None else str(f)[:120]

    @property
    def packed(self) -> bool:
        return self.split.docs is not None or self.doc_positions is not None


def needs_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """True when autograd will want gradients of this call (the training path runs)."""
    return torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))


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


def local_problem(spec: CallSpec, device_type: str, dtypes: tuple) -> Problem:
    """This rank's first problem with the call (NONE if none), before any exchange."""
    q, k, v, layout, joint_kv = spec.q, spec.k, spec.v, spec.layout, spec.joint_kv
    if any(x.dim() != 4 for x in (q, k, v)):
        return Problem.NOT_4D
    if q.dtype not in dtypes or k.dtype != q.dtype or v.dtype != q.dtype:
        return Problem.DTYPE
    if not q.device == k.device == v.device:
        return Problem.DEVICES
    if device_type != "any" and q.device.type != device_type:
        return Problem.DEVICE_TYPE
    (b, _, h, d), (bk, sk, hk, dk), (bv, sv, hv, _) = (layout.dims(x) for x in (q, k, v))
    if (bk, bv) != (b, b) or hk != hv or not hk or h % hk:
        return Problem.HEADS
    if sk != sv:
        return Problem.KV_LENGTH
    if dk != d:
        return Problem.HEAD_SIZE
    if spec.causal and (sk != layout.dims(q)[1] or joint_kv is not None):
        return Problem.NOT_ZIGZAG
    if joint_kv is not None and spec.grad:
        return Problem.JOINT_GRAD
    if joint_kv is not None and _joint_problem(k, v, joint_kv, layout):
        return Problem.JOINT_KV
    if spec.packed and (sk != layout.dims(q)[1] or joint_kv is not None):
        return Problem.PACKED_SHAPE
    if spec.chunks < 1:
        return Problem.FINAL_CHUNKS
    if not (spec.scale > 0 and spec.scale != float("inf")):
        return Problem.SCALE
    return Problem(spec.problem)
