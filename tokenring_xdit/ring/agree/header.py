"""The header every rank sends in the agreement: a fixed row of int64 slots.

One row per rank, one size for every exchange on a check communicator (a call's header and a
host's ring choice share it). Codes for settings are their index in config's tuples, so the
allowed values are written once (config.py) and the wire cannot drift from them.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Hashable

import torch

from ... import config
from ..documents import Documents
from ..layout import storage
from .problems import CallSpec, Problem, needs_grad

# header slots (int64 each)
KIND, PROBLEM, B, H, HK, D, DV, SQ, SKV = range(9)
DTYPE, LAYOUT, MODE, CHUNKS, DEVICE, SCALE, KERNEL, GRAPHS = range(9, 17)
VALIDATE, TRANSPORT, PROOF, TOTAL, CHOICE, SOURCE, INPUTS, GROUP = range(17, 25)
GPU = 25  # digest of this rank's GPU (0: not CUDA): `auto` picks ipc where ranks share one
DOCS, NDOCS = 26, 27  # packed documents: digest of cu_seqlens (-1: position ids); claims
WIRE = 28  # how q is stored (layout.storage): the vote on the layout Q and partials travel in
META_LEN = 29
DOCS_BY_POSITIONS = -1
KIND_CALL, KIND_CHOICE = 1, 2
AGREED = (slice(B, SQ), slice(DTYPE, GPU))  # the slots a Ring's settings are made of

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
DEVICE_TYPES = ("cpu", "cuda", "meta", "xpu", "mps", "hpu", "npu", "mtia")
VALIDATE_CODES = {mode: i for i, mode in enumerate(config.VALIDATE_MODES)}
TRANSPORT_CODES = {name: i for i, name in enumerate(config.TRANSPORTS)}
# a KIND_CALL header's choice slot: TokenRing runs this call (choice.Choice.TOKEN_RING)
CHOICE_TOKEN_RING = config.RING_IMPLS.index("token_ring")

# slot -> what must be equal on every ring rank (for a TokenRing call)
MUST_AGREE = {
    B: "batch size",
    H: "head count",
    HK: "K/V head count",
    D: "head size",
    DV: "value head size",
    DTYPE: "dtype",
    LAYOUT: "layout",
    MODE: "causal flag / gradient mode (1 causal, 2 requires grad)",
    CHUNKS: "final_chunks",
    DEVICE: "device type",
    SCALE: "softmax_scale",
    KERNEL: "kernel family (digest)",
    GRAPHS: "CUDA graphs on/off (TOKENRING_XDIT_CUDA_GRAPHS / cuda_graph=)",
    VALIDATE: "validate mode (TOKENRING_XDIT_VALIDATE)",
    TRANSPORT: "transport",
    PROOF: "causal layout proof (0 none, 1 declared by a sharding helper, 2 positions)",
    TOTAL: "global sequence length of the zigzag split",
    DOCS: "packed documents (digest of cu_seqlens; -1: position ids; 0: none)",
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


def agreed(meta: list[int]) -> tuple[int, ...]:
    """The slots every rank agreed on (a Ring's settings)."""
    return tuple(x for part in AGREED for x in meta[part])


def pack_call(spec: CallSpec, problem: Problem, proof: tuple[int, int]) -> list[int]:
    """This rank's header for one TokenRing call."""
    meta = [0] * META_LEN
    meta[KIND], meta[PROBLEM], meta[CHOICE] = KIND_CALL, int(problem), CHOICE_TOKEN_RING
    if problem == Problem.NOT_4D:
        return meta
    q, k, v, layout = spec.q, spec.k, spec.v, spec.layout
    b, s, h, d = layout.dims(q)
    meta[B], meta[H], meta[HK], meta[D], meta[DV] = b, h, k.shape[layout.head_dim], d, v.shape[3]
    meta[SQ], meta[SKV] = s, k.shape[layout.seq_dim]
    meta[DTYPE] = DTYPES.index(q.dtype) if q.dtype in DTYPES else -1
    meta[LAYOUT] = layout.seq_dim
    meta[MODE] = int(spec.causal) | 2 * int(needs_grad(q, k, v))  # both choose the schedule
    meta[CHUNKS] = spec.chunks
    meta[DEVICE] = DEVICE_TYPES.index(q.device.type) if q.device.type in DEVICE_TYPES else -1
    meta[SCALE] = struct.unpack("<q", struct.pack("<d", spec.scale))[0]  # the exact float
    meta[KERNEL], meta[GRAPHS] = spec.kernel, int(spec.graphs)
    meta[VALIDATE] = VALIDATE_CODES.get(spec.validate, -1)
    meta[TRANSPORT] = TRANSPORT_CODES.get(spec.transport, -1)
    meta[GPU] = _gpu_digest(q.device)
    meta[WIRE] = storage(q)
    meta[PROOF], meta[TOTAL] = proof
    if spec.documents is not None:
        meta[DOCS], meta[NDOCS] = _docs_digest(spec.documents), spec.documents.count
    elif spec.doc_positions is not None:
        meta[DOCS] = DOCS_BY_POSITIONS
    return meta


def _docs_digest(documents: Documents) -> int:
    bounds = documents.bounds
    packed = struct.pack(f"<{len(bounds)}q", *bounds)
    return int.from_bytes(hashlib.sha256(packed).digest()[:8], "little") >> 2


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


_MODES = ("non-causal inference", "causal inference", "non-causal training (inputs require "
          "grad)", "causal training (inputs require grad)")  # fmt: skip
_PROOFS = ("no proof", "declared by a sharding helper", "positions")


def device_name(index: int) -> str:
    return DEVICE_TYPES[index] if 0 <= index < len(DEVICE_TYPES) else "another device type"


def in_words(slot: int, value: int, words: dict) -> str:
    """A header slot's value as a user would write it."""

    def pick(names, index: int) -> str:
        return names[index] if 0 <= index < len(names) else f"unknown ({index})"

    if slot == DTYPE:
        return str(DTYPES[value]).replace("torch.", "") if 0 <= value < len(DTYPES) else "other"
    if slot == LAYOUT:
        return {1: "bshd", 2: "bhsd"}.get(value, f"sequence dim {value}")
    if slot == MODE:
        return pick(_MODES, value)
    if slot == DEVICE:
        return device_name(value)
    if slot == SCALE:
        return repr(struct.unpack("<d", struct.pack("<q", value))[0])
    if slot == KERNEL:
        return repr(words["kernel"]) if words.get("kernel") else f"kernel #{value % 10007}"
    if slot == GRAPHS:
        return "on" if value else "off"
    if slot == VALIDATE:
        return dict(enumerate(config.VALIDATE_MODES)).get(value, "invalid")
    if slot == TRANSPORT:
        return dict(enumerate(config.TRANSPORTS)).get(value, "invalid")
    if slot == PROOF:
        return pick(_PROOFS, value)
    if slot == CHUNKS and value < 1:
        return "an invalid value"
    return str(value)
