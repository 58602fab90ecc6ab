"""One agreed ring per call: the input check every rank runs before any transfer.

Every fact that decides what a call does is packed into one fixed-size header per rank (shapes,
dtype, layout, causal/gradient mode and the proof of a causal call's zigzag layout, the kernel
family, final pieces, CUDA graphs on/off, validate mode, transport, the scale's exact bits) and
exchanged in one small all-gather on the ring's own CPU communicator (it never synchronises the
GPU and never shares a group with the host's collectives). Every rank then raises the same error,
or every rank gets the same `Ring`: the communicators, every rank's query length and the agreed
settings. Caches (this check's, the CUDA graphs') key on that agreed value, never on one rank's
view. Hosts agree on their ring choice through the same header (`agree_ring_choice`), so ranks
that picked different rings fail together instead of meeting in two different protocols.

When the exchange runs (RingConfig.validate): "always" every call; "signature" only for an input
signature this rank has not seen (a peer whose shapes change alone then waits for us until the
deadline and both sides raise the named error; use "always" where that can happen); "auto"
(default) is "always" on gloo rings, where the exchange is cheap next to CPU attention, and
"signature" on NCCL rings (docs/troubleshooting.md: the measured cost).

Packed documents are agreed here too: `cu_seqlens` of the whole sequence travel as a digest in
the header (every rank must pass the same ones); position ids that restart are turned into
per-rank claims (documents.py) that a second all-gather on the same communicator brings to
every rank, which then builds and checks the same documents (so a mismatch is one error on
every rank, raised before any transfer).
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..config import ENV
from .comm import COUNTERS, RingComms, RingPosition, TokenRingCommError, comms_of, torch_lanes
from .comm.groups import RELEASE_HOOKS, describe_peer
from .comm.ipc import ipc_finished, ipc_lanes
from .comm.watchdog import watch
from .documents import Documents, claim_count, documents_from_claims, local_claims
from .layout import Layout
from .sharding import BAD_POSITIONS, NO_PROOF, proof_of

__all__ = ["Ring", "CallSpec", "agree", "agree_ring_choice", "needs_grad", "digest"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_DEVICE_TYPES = ("cpu", "cuda", "meta", "xpu", "mps", "hpu", "npu", "mtia")
VALIDATE_CODES = {"auto": 0, "always": 1, "signature": 2}
TRANSPORT_CODES = {"nccl": 0, "ipc": 1, "auto": 2}  # config.TRANSPORTS

_PROBLEMS = {
    1: "q, k and v must be 4-d tensors in the {layout} layout",
    2: "q, k and v must share one floating dtype (float32, float16, bfloat16 or float64)",
    3: "k and v must match q in batch size and have one head count that divides q's (GQA/MQA: "
    "q heads = g x K/V heads, query head i uses K/V head i // g)",
    4: "k and v must have the same sequence length",
    5: "q and k must have the same head size",
    6: "causal=True needs zigzag shards: q, k and v of one even length (two equal halves, "
    "chunks r and 2N-1-r of 2N equal chunks), the same length on every rank, and no joint K/V. "
    "Cut them with tokenring_xdit.shard(x, group, causal=True) or yunchang's "
    "EXTRACT_FUNC_DICT['token_ring'], on a sequence whose length divides by 2N (pad it)",
    7: "q, k and v must be on one device",
    8: "gradients through joint K/V are not supported: run joint attention under "
    "torch.no_grad() or torch.inference_mode()",
    9: "joint K/V must be a (key, value) pair of 4-d tensors matching k/v in batch size, "
    "head count, head sizes, dtype and device",
    10: "final_chunks (argument, or TOKENRING_XDIT_FINAL_CHUNKS) must be a positive integer",
    11: "q, k and v must be on the device type this ring's transport moves ({device} for this "
    "group and TOKENRING_XDIT_TRANSPORT), not {got}{hint}",
    12: "softmax_scale must be a finite positive number",
    13: "the kernel cannot be used: {detail}",
    16: "the kernel does not support this call: {detail}",
    14: "causal=True: `positions` are not this rank's zigzag positions (rank r holds chunks r "
    "and 2N-1-r of 2N equal chunks); cut the shards with tokenring_xdit.shard(x, group, "
    "causal=True), whose positions are tokenring_xdit.ring.sharding.zigzag_positions(...)",
    15: "causal=True needs proof that the shards are zigzag shards (contiguous shards give "
    "wrong results silently): cut them with tokenring_xdit.shard(x, group, causal=True) or "
    "yunchang's EXTRACT_FUNC_DICT['token_ring'] (both record the split for the group), or "
    "pass the shard's global token positions as positions=",
    17: "cu_seqlens are not usable: {detail}",
    18: "packed documents (cu_seqlens / position_ids) need k and v of the query's length (the "
    "same tokens), no joint K/V, and one document layout for the whole batch (pack every "
    "document into one row, batch size 1)",
    19: "position_ids (packed, restarting at 0 per document) must be (s,) or (b, s) with equal "
    "rows for this rank's s queries, count up by one inside a document and restart at 0 where "
    "one starts; or pass cu_seqlens of the whole sequence",
}
_NOT_IMPLEMENTED = (6, 8, 16)

# header slots (int64 each); one size for every exchange on a check communicator
_KIND, _PROBLEM, _B, _H, _HK, _D, _DV, _SQ, _SKV = range(9)
_DTYPE, _LAYOUT, _MODE, _CHUNKS, _DEVICE, _SCALE, _KERNEL, _GRAPHS = range(9, 17)
_VALIDATE, _TRANSPORT, _PROOF, _TOTAL, _CHOICE, _SOURCE, _INPUTS, _GROUP = range(17, 25)
_GPU = 25  # digest of this rank's GPU (0: not CUDA): `auto` picks ipc where ranks share one
_DOCS, _NDOCS = 26, 27  # packed documents: digest of cu_seqlens (-1: position ids); claims
_META_LEN = 28
DOCS_BY_POSITIONS = -1
KIND_CALL, KIND_CHOICE = 1, 2
CHOICE_TOKEN_RING = 1  # a KIND_CALL header's choice slot: TokenRing runs this call

# slot -> what must be equal on every ring rank (for a TokenRing call)
_MUST_AGREE = {
    _B: "batch size",
    _H: "head count",
    _HK: "K/V head count",
    _D: "head size",
    _DV: "value head size",
    _DTYPE: "dtype",
    _LAYOUT: "layout",
    _MODE: "causal flag / gradient mode (1 causal, 2 requires grad)",
    _CHUNKS: "final_chunks",
    _DEVICE: "device type",
    _SCALE: "softmax_scale",
    _KERNEL: "kernel family (digest)",
    _GRAPHS: "CUDA graphs on/off (TOKENRING_XDIT_CUDA_GRAPHS / cuda_graph=)",
    _VALIDATE: "validate mode (TOKENRING_XDIT_VALIDATE)",
    _TRANSPORT: "transport",
    _PROOF: "causal layout proof (0 none, 1 declared by a sharding helper, 2 positions)",
    _TOTAL: "global sequence length of the zigzag split",
    _DOCS: "packed documents (digest of cu_seqlens; -1: position ids; 0: none)",
}


@functools.lru_cache(maxsize=1024)  # runs on every call; keys are few (kernels, choices)
def digest(key: Hashable) -> int:
    """A 62-bit name of `key` that is equal on every rank for equal keys (functions by module
    and qualified name, never by address)."""
    return int.from_bytes(hashlib.sha256(_stable(key).encode()).digest()[:8], "little") >> 2


def _stable(key) -> str:
    if isinstance(key, tuple | list):
        return "(" + ",".join(_stable(x) for x in key) + ")"
    if callable(key) and hasattr(key, "__qualname__"):
        return f"{getattr(key, '__module__', '')}.{key.__qualname__}"
    return repr(key)


@dataclass(frozen=True)
class CallSpec:
    """What this rank asks of one TokenRing call (ring.api builds it)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    layout: Layout
    causal: bool
    chunks: int
    scale: float
    kernel: int  # digest of the kernel family
    graphs: bool
    validate: str
    joint_kv: tuple[torch.Tensor, torch.Tensor] | None = None
    positions: torch.Tensor | None = None
    problem: int = 0  # found before the check (13/16: the kernel's ValueError/NotImplemented)
    detail: str = ""
    transport: str = "nccl"  # requested (config.TRANSPORTS); the agreed one is Ring.transport
    timeout: float | None = None  # this call's deadline in seconds (RingConfig.timeout)
    kernel_name: str = ""  # the kernel family in words (errors name it; `kernel` is agreed)
    documents: Documents | None = None  # packed documents from cu_seqlens (checked by the api)
    doc_positions: torch.Tensor | None = None  # or this rank's position ids that restart

    @property
    def packed(self) -> bool:
        return self.documents is not None or self.doc_positions is not None


@dataclass(frozen=True, eq=False)
class Ring:
    """The agreed ring of one call: equal on every rank except `rank` and `comms`' handles."""

    pos: RingPosition
    comms: RingComms | None  # None for a ring of one
    q_lens: tuple[int, ...]  # every ring rank's local query length
    settings: tuple[int, ...]  # the agreed header slots (every rank's are equal)
    transport: str = "nccl"  # how the lanes move data: "nccl" (torch.distributed) or "ipc"
    docs: Documents | None = None  # the agreed packed documents of the global sequence

    @property
    def rank(self) -> int:
        return self.pos.rank

    @property
    def size(self) -> int:
        return self.pos.size

    @property
    def key(self) -> tuple:
        """The agreed value, for caches (no rank-local fact in it)."""
        return (self.q_lens, self.settings)

    def lanes(self):
        """(Q lane, return lane) for one call."""
        if self.transport == "ipc":
            return ipc_lanes(self.comms, self.pos.rank)
        return torch_lanes(self.comms, self.pos.rank)

    def finished(self, what: str) -> None:
        """Bound the NCCL work this call queued by the ring's deadline (never blocks the host;
        gloo waits are bounded where they block; IPC: the host waits, bounded, for the call)."""
        comms = self.comms
        if comms is not None and self.transport == "ipc":
            ipc_finished(comms, what)
        elif comms is not None and comms.backend != "gloo":
            if not torch.cuda.is_current_stream_capturing():  # a replay is watched instead
                watch(comms, what)


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


def _local_problem(spec: CallSpec, device_type: str) -> int:
    q, k, v, layout, joint_kv = spec.q, spec.k, spec.v, spec.layout, spec.joint_kv
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
    if spec.causal and (sk != layout.dims(q)[1] or joint_kv is not None):
        return 6
    if joint_kv is not None and needs_grad(q, k, v):
        return 8
    if joint_kv is not None and _joint_problem(k, v, joint_kv, layout):
        return 9
    if spec.packed and (sk != layout.dims(q)[1] or joint_kv is not None):
        return 18
    if spec.chunks < 1:
        return 10
    if not (spec.scale > 0 and spec.scale != float("inf")):
        return 12
    return spec.problem


def _meta(spec: CallSpec, problem: int, proof: tuple[int, int]) -> list[int]:
    meta = [0] * _META_LEN
    meta[_KIND], meta[_PROBLEM], meta[_CHOICE] = KIND_CALL, problem, CHOICE_TOKEN_RING
    if problem == 1:
        return meta
    q, k, v, layout = spec.q, spec.k, spec.v, spec.layout
    b, s, h, d = layout.dims(q)
    meta[_B], meta[_H], meta[_HK], meta[_D], meta[_DV] = (
        b,
        h,
        k.shape[layout.head_dim],
        d,
        v.shape[3],
    )
    meta[_SQ], meta[_SKV] = s, k.shape[layout.seq_dim]
    meta[_DTYPE] = _DTYPES.index(q.dtype) if q.dtype in _DTYPES else -1
    meta[_LAYOUT] = layout.seq_dim
    meta[_MODE] = int(spec.causal) | 2 * int(needs_grad(q, k, v))  # both choose the schedule
    meta[_CHUNKS] = spec.chunks
    meta[_DEVICE] = _DEVICE_TYPES.index(q.device.type) if q.device.type in _DEVICE_TYPES else -1
    meta[_SCALE] = struct.unpack("<q", struct.pack("<d", spec.scale))[0]  # the exact float
    meta[_KERNEL], meta[_GRAPHS] = spec.kernel, int(spec.graphs)
    meta[_VALIDATE] = VALIDATE_CODES.get(spec.validate, -1)
    meta[_TRANSPORT] = TRANSPORT_CODES.get(spec.transport, -1)
    meta[_GPU] = _gpu_digest(q.device)
    meta[_PROOF], meta[_TOTAL] = proof
    if spec.documents is not None:
        meta[_DOCS], meta[_NDOCS] = _docs_digest(spec.documents.bounds), spec.documents.count
    elif spec.doc_positions is not None:
        meta[_DOCS] = DOCS_BY_POSITIONS
    return meta


def _docs_digest(bounds: tuple[int, ...]) -> int:
    packed = struct.pack(f"<{len(bounds)}q", *bounds)
    return int.from_bytes(hashlib.sha256(packed).digest()[:8], "little") >> 2


def _exchange(comms: RingComms, rank: int, meta: list[int]) -> list[list[int]]:
    meta[_GROUP] = comms.name
    mine = torch.tensor(meta, dtype=torch.int64)
    everyone = [torch.empty_like(mine) for _ in comms.ranks]
    try:  # CPU: no GPU synchronisation; bounded by this call's deadline
        work = dist.all_gather(everyone, mine, group=comms.check, async_op=True)
        work.wait(comms.deadline)
    except RuntimeError as exc:
        message = (
            f"TokenRing input check failed on {describe_peer(comms, rank)}: a rank of the ring "
            f"(global ranks {list(comms.ranks)}) did not take part within "
            f"{comms.deadline.total_seconds():.0f} s "
            f"({str(exc).strip().splitlines()[0][:200]}); likely causes: that rank raised or "
            "exited before this call (see its log), called TokenRing fewer times, passed a "
            "different group, or runs with TOKENRING_XDIT_VALIDATE=signature while its shapes "
            "changed alone"
        )
        comms.fail(message)
        raise TokenRingCommError(message) from exc
    COUNTERS.handshakes += 1
    metas = torch.stack(everyone).tolist()
    _raise_group(metas, comms)
    return metas


def _raise_for(
    metas: list[list[int]],
    spec: CallSpec,
    rank: int,
    device_type: str,
    comms: RingComms | None = None,
) -> None:
    _raise_choice(metas, rank)
    bad = [(r, m[_PROBLEM]) for r, m in enumerate(metas) if m[_PROBLEM]]
    differ = [i for i in _MUST_AGREE if len({m[i] for m in metas}) > 1]
    if bad or differ:  # every rank sees the same headers, so all take this path together
        words = _words(comms, spec)
    if bad:
        lines = []
        for r, c in bad:
            got = _device_name(metas[r][_DEVICE])
            text = _PROBLEMS[c].format(
                layout=spec.layout.name,
                device=device_type,
                got=got,
                detail=words[r]["detail"],
                hint=_device_hint(got, metas[r][_TRANSPORT]),
            )
            lines.append(f"rank {r}: {text}")
        kind = NotImplementedError if all(c in _NOT_IMPLEMENTED for _, c in bad) else ValueError
        raise kind(
            "TokenRing input rejected on ring rank(s) {}:\n  {}".format(
                [r for r, _ in bad], "\n  ".join(lines)
            )
        )
    if differ:
        i = differ[0]
        each = ", ".join(
            f"rank {r} has {_in_words(i, m[i], words[r])}" for r, m in enumerate(metas)
        )
        raise ValueError(
            f"TokenRing: {_MUST_AGREE[i]} differs across ring ranks: {each}; pass the same on "
            "every rank"
        )
    if metas[0][_MODE] & 1 and len(metas) > 1:
        _check_zigzag(metas)


def _device_hint(got: str, transport: int) -> str:
    """The fix for tensors on a device type the transport does not move."""
    if transport == TRANSPORT_CODES["ipc"] and got != "cuda":
        return (
            " (TOKENRING_XDIT_TRANSPORT=ipc moves CUDA tensors only: move q/k/v to the GPU, or "
            f"unset it / set it to nccl or auto for {got} tensors)"
        )
    if got == "cuda":
        return " (CUDA tensors on a gloo group: TOKENRING_XDIT_TRANSPORT=ipc or auto)"
    return ""


def _words(comms: RingComms | None, spec: CallSpec) -> list[dict]:
    """Every rank's own words for an error that the headers only hold as codes (a kernel's
    reason, its family's name). Only on the error path, which every ring rank takes together."""
    mine = {"detail": spec.detail, "kernel": spec.kernel_name}
    if comms is None:
        return [mine]
    everyone: list = [None] * len(comms.ranks)
    dist.all_gather_object(everyone, mine, group=comms.check)
    return everyone


_MODES = ("non-causal inference", "causal inference", "non-causal training (inputs require "
          "grad)", "causal training (inputs require grad)")  # fmt: skip
_PROOFS = ("no proof", "declared by a sharding helper", "positions")


def _in_words(slot: int, value: int, words: dict) -> str:
    """A header slot's value as a user would write it."""

    def pick(names, index: int) -> str:
        return names[index] if 0 <= index < len(names) else f"unknown ({index})"

    if slot == _DTYPE:
        return str(_DTYPES[value]).replace("torch.", "") if 0 <= value < len(_DTYPES) else "other"
    if slot == _LAYOUT:
        return {1: "bshd", 2: "bhsd"}.get(value, f"sequence dim {value}")
    if slot == _MODE:
        return pick(_MODES, value)
    if slot == _DEVICE:
        return _device_name(value)
    if slot == _SCALE:
        return repr(struct.unpack("<d", struct.pack("<q", value))[0])
    if slot == _KERNEL:
        return repr(words["kernel"]) if words.get("kernel") else f"kernel #{value % 10007}"
    if slot == _GRAPHS:
        return "on" if value else "off"
    if slot == _VALIDATE:
        return {v: k for k, v in VALIDATE_CODES.items()}.get(value, "invalid")
    if slot == _TRANSPORT:
        return {v: k for k, v in TRANSPORT_CODES.items()}.get(value, "invalid")
    if slot == _PROOF:
        return pick(_PROOFS, value)
    if slot == _CHUNKS and value < 1:
        return "an invalid value"
    return str(value)


def _check_zigzag(metas: list[list[int]]) -> None:
    """Every rank's causal shard is its part of ONE zigzag split of `total` tokens."""
    lens = [m[_SQ] for m in metas]
    total = metas[0][_TOTAL]
    if len(set(lens)) > 1 or total != sum(lens):
        raise ValueError(
            f"TokenRing: causal=True needs one zigzag split of the whole sequence, the same "
            f"length on every rank: local lengths {lens} (sum {sum(lens)}) vs the split's "
            f"{total} tokens. Pad the sequence to a multiple of 2N and cut it with "
            "tokenring_xdit.shard(x, group, causal=True) (torch.chunk makes unequal chunks)"
        )


_CHOICES = {0: "the host's own ring", CHOICE_TOKEN_RING: "TokenRing", 2: "auto"}
# where a host's choice came from (hosts/selection.xdit_ring_impl's names; the last is the
# environment variable, named by config.ENV)
_SOURCES = ("default", "set_xdit_ring_impl()", "--ring_impl_type", ENV["ring_impl"][0])


def _raise_group(metas: list[list[int]], comms: RingComms) -> None:
    names = [m[_GROUP] for m in metas]
    if len(set(names)) > 1:
        raise ValueError(
            f"TokenRing: the ranks of the ring of global ranks {list(comms.ranks)} passed "
            f"different process groups with the same ranks (group digests {names}); pass the "
            "same group object on every rank (the one new_group returned for these ranks)"
        )


def _raise_choice(metas: list[list[int]], rank: int) -> None:
    choices = [(m[_KIND], m[_CHOICE], m[_INPUTS]) for m in metas]
    if len(set(choices)) <= 1:
        return
    lines = []
    for r, m in enumerate(metas):
        what = _CHOICES.get(m[_CHOICE], "?")
        if m[_KIND] == KIND_CALL:
            lines.append(f"rank {r}: TokenRing (a direct TokenRing call)")
            continue
        inputs = f" (decides from inputs #{m[_INPUTS] % 10007})" if m[_CHOICE] == 2 else ""
        lines.append(f"rank {r}: {what}, chosen by {_SOURCES[m[_SOURCE]]}{inputs}")
    raise ValueError(
        "TokenRing: the ring ranks chose different ring attentions for the same call, so "
        "neither can run:\n  " + "\n  ".join(lines) + "\nSet TOKENRING_XDIT_RING_IMPL / "
        "--ring_impl_type / set_xdit_ring_impl() identically on every rank; under `auto` also "
        "TOKENRING_XDIT_FABRIC, NCCL_P2P_DISABLE, CUDA graphs and requires_grad"
    )


def _device_name(index: int) -> str:
    return _DEVICE_TYPES[index] if 0 <= index < len(_DEVICE_TYPES) else "another device type"


_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 256


def _cached(key):
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
    return hit


def _remember(key, value) -> None:
    _CACHE[key] = value
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)


RELEASE_HOOKS.append(_CACHE.clear)  # keys and rings hold their group: let destroyed ones go


def _always(validate: str, device_type: str) -> bool:
    return validate == "always" or (validate == "auto" and device_type == "cpu")


def _fast_key(spec: CallSpec, pos: RingPosition) -> tuple | None:
    """Everything a non-causal call's header is made of, read without building it (the cheap
    per-call path of the signature cache). Causal calls carry a proof to read each time."""
    if spec.causal or spec.packed:
        return None
    q, k, v, joint = spec.q, spec.k, spec.v, spec.joint_kv
    grad = needs_grad(q, k, v)
    joint_sig = None if joint is None else tuple((x.shape, x.dtype, x.device) for x in joint)
    return (pos.group, spec.layout, spec.chunks, spec.scale, spec.kernel, spec.graphs,
            spec.validate, spec.transport, spec.problem, grad, joint_sig, q.shape, k.shape, v.shape,
            q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, spec.timeout)  # fmt: skip


def agree(spec: CallSpec, pos: RingPosition) -> Ring:
    """Validate this call on every ring rank at once and return the agreed ring."""
    comms = comms_of(pos.group) if pos.size > 1 else None
    if comms is not None:
        comms.ensure_usable()
        if spec.timeout is not None:  # this call's deadline: its lanes, watchdog and check
            comms = comms.with_deadline(spec.timeout)
    device_type = _ring_device_type(comms, spec)
    use_cache = comms is not None and not _always(spec.validate, device_type)
    fast = None
    if use_cache:
        fast = _fast_key(spec, pos)
        hit = _cached(fast) if fast is not None else None
        if hit is not None:
            return hit
    problem = _local_problem(spec, device_type)
    proof = (NO_PROOF, 0)
    if not problem and spec.causal and pos.size > 1:
        s = spec.q.shape[spec.layout.seq_dim]
        proof = proof_of(pos.group, spec.positions, pos.rank, pos.size, s)
        if s % 2:
            problem = 6  # a zigzag shard is two equal halves
        elif proof[0] == BAD_POSITIONS:
            problem, proof = 14, (NO_PROOF, 0)
        elif proof[0] == NO_PROOF:
            problem = 15
    claims = 0
    if not problem and spec.doc_positions is not None:
        claims = claim_count(
            spec.doc_positions, spec.q.shape[spec.layout.seq_dim], _chunks(spec, pos)
        )
        problem = 19 if claims < 0 else 0
    meta = _meta(spec, problem, proof)
    meta[_NDOCS] = max(meta[_NDOCS], claims)
    if comms is None:
        _raise_for([meta], spec, 0, device_type)  # a ring of one: its own words
        docs = _documents(None, 0, [meta], spec, pos)
        return Ring(pos, None, (meta[_SQ],), tuple(meta[_B:_SQ] + meta[_DTYPE:_GPU]), docs=docs)
    # Our K/V length is nobody else's business (K/V never move), so a KV cache growing on one
    # rank must not send that rank alone into the exchange: leave it out of the key.
    key = (pos.group, tuple(meta[:_SKV] + meta[_SKV + 1 :]), spec.q.device, spec.timeout)
    use_cache = use_cache and spec.doc_positions is None  # their documents are new per call
    if use_cache and problem == 0:
        hit = _cached(key)
        if hit is not None:
            if fast is not None:
                _remember(fast, hit)
            return hit
    metas = _exchange(comms, pos.rank, meta)
    _raise_for(metas, spec, pos.rank, device_type, comms)
    agreed = metas[0][_B:_SQ] + metas[0][_DTYPE:_GPU]  # slots every rank agreed on
    transport = _resolve_transport(metas, comms.backend)
    docs = _documents(comms, pos.rank, metas, spec, pos)
    ring = Ring(pos, comms, tuple(m[_SQ] for m in metas), tuple(agreed), transport, docs)
    _remember(key, ring)
    if fast is not None:
        _remember(fast, ring)
    return ring


def _chunks(spec: CallSpec, pos: RingPosition) -> int:
    """Chunks of a local shard: 2 for a zigzag shard (causal over a ring), else 1."""
    return 2 if spec.causal and pos.size > 1 else 1


def _documents(comms, rank: int, metas, spec: CallSpec, pos: RingPosition) -> Documents | None:
    """The agreed packed documents (every rank's metas agree by now), checked against the ring's
    total length; from position ids through one more all-gather of every rank's claims."""
    if not spec.packed:
        return None
    q_lens = [m[_SQ] for m in metas]
    total = sum(q_lens)
    if spec.documents is not None:
        if spec.documents.total != total:
            raise ValueError(
                f"TokenRing: cu_seqlens end at {spec.documents.total} but the ring holds "
                f"{total} tokens (local lengths {q_lens}); cu_seqlens describe the WHOLE packed "
                "sequence (pad it with one more document to the padded length)"
            )
        return spec.documents
    chunks = _chunks(spec, pos)
    length = q_lens[rank]
    if chunks == 2:
        c, n = length // 2, len(q_lens)
        starts = [rank * c, (2 * n - 1 - rank) * c]
    else:
        starts = [sum(q_lens[:rank])]
    mine = local_claims(spec.doc_positions, starts, length)
    if comms is None:
        return documents_from_claims([mine], chunks, total)
    width = max(m[_NDOCS] for m in metas)
    buf = torch.full((width,), -2, dtype=torch.int64)
    buf[: len(mine)] = torch.tensor(mine, dtype=torch.int64)
    everyone = [torch.empty_like(buf) for _ in metas]
    try:
        dist.all_gather(everyone, buf, group=comms.check)
    except RuntimeError as exc:
        message = (
            f"TokenRing: the exchange of packed document starts failed on "
            f"{describe_peer(comms, rank)}: {str(exc).strip().splitlines()[0][:200]}"
        )
        comms.fail(message)
        raise TokenRingCommError(message) from exc
    claims = [x[: m[_NDOCS]].tolist() for x, m in zip(everyone, metas, strict=True)]
    return documents_from_claims(claims, chunks, total)


def agree_ring_choice(
    group: dist.ProcessGroup,
    choice: int,
    source: str,
    auto_inputs: Hashable,
    lengths: tuple[int, int],
    device: torch.device,
    validate: str,
) -> tuple[int, int]:
    """A host's ring choice for one call, agreed on every ring rank before either ring runs.

    choice: 0 the host's ring, 1 TokenRing, 2 auto; source: where it came from (_SOURCES);
    auto_inputs: what `auto` decides from besides the shapes (fabric, graphs, gradients: equal
    on every rank or an error). Returns the longest (q, kv) local lengths over the ring, so
    `auto` decides the same on every rank.
    """
    pos = RingPosition.of(group)
    if pos.size == 1:
        return lengths
    comms = comms_of(pos.group)
    comms.ensure_usable()
    meta = [0] * _META_LEN
    meta[_KIND], meta[_CHOICE] = KIND_CHOICE, choice
    meta[_SOURCE] = _SOURCES.index(source) if source in _SOURCES else 0
    meta[_INPUTS] = digest(auto_inputs) if choice == 2 else 0
    meta[_SQ], meta[_SKV] = lengths
    device_type = "cpu" if comms.backend == "gloo" else "cuda"
    key = ("choice", pos.group, tuple(meta), device)
    if not _always(validate, device_type):
        hit = _cached(key)
        if hit is not None:
            return hit
    metas = _exchange(comms, pos.rank, meta)
    _raise_choice(metas, pos.rank)
    longest = (max(m[_SQ] for m in metas), max(m[_SKV] for m in metas))
    _remember(key, longest)
    return longest


def _ring_device_type(comms: RingComms | None, spec: CallSpec) -> str:
    """The device type the ring's transport moves: cpu for gloo, cuda for NCCL and IPC; `auto`
    on gloo moves either (CPU tensors on gloo, CUDA tensors over IPC)."""
    if comms is None:
        return "any"  # nothing moves
    if spec.transport == "ipc":
        return "cuda"
    if spec.transport == "auto" and comms.backend == "gloo":
        device = getattr(spec.q, "device", None)
        return "cuda" if device is not None and device.type == "cuda" else "cpu"
    return "cpu" if comms.backend == "gloo" else "cuda"


def _resolve_transport(metas: list[list[int]], backend: str) -> str:
    """The agreed transport ("nccl" or "ipc") from every rank's header (the requested mode is
    equal on every rank by now): `auto` is ipc for CUDA tensors on a gloo group or when two
    ranks share a GPU (NCCL refuses that), else nccl."""
    code = metas[0][_TRANSPORT]
    if code == TRANSPORT_CODES["ipc"]:
        return "ipc"
    if code == TRANSPORT_CODES["auto"] and metas[0][_DEVICE] == _DEVICE_TYPES.index("cuda"):
        gpus = [m[_GPU] for m in metas]
        if backend == "gloo" or len(set(gpus)) < len(gpus):
            return "ipc"
    return "nccl"


_GPU_DIGESTS: dict[int, int] = {}


def _gpu_digest(device: torch.device) -> int:
    """A name of the physical GPU (its UUID), equal in every process that uses it."""
    if device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    found = _GPU_DIGESTS.get(index)
    if found is None:
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        found = _GPU_DIGESTS[index] = digest(("gpu", uuid))
    return found
