"""The header every rank sends in the agreement: a typed record, one int64 row on the wire.

One row per rank, one size for every exchange on a check communicator (a call's header and a
host's ring choice share it). Codes are codes.py's. Which fields must be equal on every rank
(MUST_AGREE), which a cached agreement keys on (CACHE_KEY) and which make a Ring's settings
(RING_SETTINGS) are stated here once, by field name.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import struct
from collections.abc import Hashable
from dataclasses import dataclass
from operator import attrgetter

import torch

from ..split.value import Documents, split_words
from ..tensor_layout import storage
from .codes import (
    DOCS_BY_POSITIONS,
    DTYPES,
    LAYOUT_WORDS,
    TRANSPORT_CODES,
    VALIDATE_CODES,
    Choice,
    ChoiceSource,
    Kind,
    Mode,
    device_code,
    device_name,
    dtype_code,
)  # fmt: skip
from .problems import CallSpec, Problem

__all__ = ["Header", "MUST_AGREE", "CACHE_KEY", "RING_SETTINGS", "digest", "call_header"]


@dataclass
class Header:
    """One rank's header. Enum fields read back as their enums (every rank runs this version)."""

    kind: Kind = Kind.CALL
    problem: Problem = Problem.NONE
    batch: int = 0
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    v_head_dim: int = 0
    q_len: int = 0
    kv_len: int = 0
    dtype: int = 0  # index in codes.DTYPES (-1: another)
    layout: int = 0  # the layout's sequence dim (codes.LAYOUT_WORDS)
    mode: Mode = Mode.NON_CAUSAL
    chunks: int = 0  # final_chunks
    device: int = 0  # index in codes.DEVICE_TYPES (-1: another)
    scale: int = 0  # the softmax scale's exact float64 bits
    kernel: int = 0  # digest of the kernel family
    graphs: int = 0  # CUDA graphs off/on, or 2: auto (training: from the agreed lengths)
    validate: int = 0  # codes.VALIDATE_CODES (-1: invalid)
    transport: int = 0  # requested: codes.TRANSPORT_CODES (-1: invalid)
    split: int = 0  # the call's split: its kind and global length (split/value.py `Split.code`)
    choice: Choice = Choice.TOKEN_RING  # a host's ring choice (a call: TokenRing runs it)
    source: ChoiceSource = ChoiceSource.DEFAULT  # where the choice came from
    inputs: int = 0  # digest of what `auto` decides from (auto choices only)
    group: int = 0  # digest of the group's name (set by the exchange)
    gpu: int = 0  # digest of this rank's GPU (0: not CUDA): `auto` picks ipc where ranks share one
    docs: int = 0  # packed documents: digest of cu_seqlens, DOCS_BY_POSITIONS, or 0 (none)
    ndocs: int = 0  # packed documents: their count, or this rank's claims
    wire: int = 0  # how q is stored (layout.storage): the vote on the layout Q travels in
    options: int = 0  # digest of the call's agreed options (CallSpec.agreed)
    # a training call's K/V length: agreed and keyed on (the K/V family sizes its buffers by
    # every rank's), unlike kv_len, which an inference KV cache grows on one rank alone
    train_kv_len: int = 0

    def row(self) -> list[int]:
        return list(map(int, _ROW(self)))

    @classmethod
    def of_row(cls, row: list[int]) -> Header:
        values = dict(zip(FIELDS, row, strict=True))
        return cls(**{name: _TYPED.get(name, int)(v) for name, v in values.items()})

    def cache_key(self) -> tuple[int, ...]:
        """What a cached agreement keys on (CACHE_KEY)."""
        return _CACHE_KEY(self)  # enum fields compare and hash as their ints

    def ring_settings(self) -> tuple[int, ...]:
        """The agreed fields a Ring's settings are made of (RING_SETTINGS)."""
        return tuple(map(int, _RING_SETTINGS(self)))


FIELDS = tuple(f.name for f in dataclasses.fields(Header))
META_LEN = len(FIELDS)
_TYPED = {"kind": Kind, "problem": Problem, "mode": Mode, "choice": Choice, "source": ChoiceSource}
# A cached agreement keys on every field but this rank's K/V length (K/V never move, so a KV
# cache growing on one rank must not send it alone into the exchange) and how its q is stored
# (each rank views or copies its q into the agreed wire layout, whatever the vote was).
CACHE_KEY = tuple(name for name in FIELDS if name not in ("kv_len", "wire"))
# A Ring's settings: the shapes but the lengths, and every setting (kernel, mode, split...)
RING_SETTINGS = (
    "batch", "heads", "kv_heads", "head_dim", "v_head_dim", "dtype", "layout", "mode", "chunks",
    "device", "scale", "kernel", "graphs", "validate", "transport", "split", "choice", "source",
    "inputs", "options",
)  # fmt: skip

_ROW, _CACHE_KEY, _RING_SETTINGS = (attrgetter(*names) for names in (FIELDS, CACHE_KEY,
                                                                     RING_SETTINGS))  # fmt: skip

# field -> what must be equal on every ring rank (for a TokenRing call)
MUST_AGREE = {
    "batch": "batch size",
    "heads": "head count",
    "kv_heads": "K/V head count",
    "head_dim": "head size",
    "v_head_dim": "value head size",
    "dtype": "dtype",
    "layout": "layout",
    "mode": "causal flag / gradient mode",
    "chunks": "final_chunks",
    "device": "device type",
    "scale": "softmax_scale",
    "kernel": "kernel family (digest)",
    "graphs": "CUDA graphs on/off (TOKENRING_XDIT_CUDA_GRAPHS, training: "
    "TOKENRING_XDIT_TRAIN_CUDA_GRAPH / cuda_graph=)",
    "validate": "validate mode (TOKENRING_XDIT_VALIDATE)",
    "transport": "transport",
    "split": "split of the sequence (split=, or what positions= prove)",
    "docs": "packed documents (digest of cu_seqlens; -1: position ids; 0: none)",
    "options": "call options",  # the error names the option (agreement._option_differs)
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


def call_header(spec: CallSpec, problem: Problem) -> Header:
    """This rank's header for one TokenRing call."""
    if problem == Problem.NOT_4D:
        return Header(problem=problem)
    q, k, v, layout = spec.q, spec.k, spec.v, spec.layout
    b, s, h, d = layout.dims(q)
    mode = (Mode.CAUSAL if spec.causal else Mode.NON_CAUSAL) | (
        Mode.GRAD if spec.grad else Mode.NON_CAUSAL
    )
    docs, ndocs = 0, 0
    if spec.split.docs is not None:
        docs, ndocs = _docs_digest(spec.split.docs), spec.split.docs.count
    elif spec.doc_positions is not None:
        docs = DOCS_BY_POSITIONS
    return Header(
        problem=problem, batch=b, heads=h, kv_heads=k.shape[layout.head_dim], head_dim=d,
        v_head_dim=v.shape[3], q_len=s, kv_len=k.shape[layout.seq_dim], dtype=dtype_code(q.dtype),
        layout=layout.seq_dim, mode=mode, chunks=spec.chunks, device=device_code(q.device),
        scale=struct.unpack("<q", struct.pack("<d", spec.scale))[0], kernel=spec.kernel,
        graphs=2 if spec.graphs is None else int(spec.graphs),
        validate=VALIDATE_CODES.get(spec.validate, -1),
        transport=TRANSPORT_CODES.get(spec.transport, -1), split=spec.split.code,
        gpu=_gpu_digest(q.device), docs=docs, ndocs=ndocs, wire=storage(q),
        options=digest(spec.agreed), train_kv_len=k.shape[layout.seq_dim] if spec.train else 0,
    )  # fmt: skip


@functools.lru_cache(maxsize=64)  # the same documents every layer and call
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


def in_words(field: str, value: int, words: dict) -> str:
    """A header field's value as a user would write it."""
    if field == "dtype":
        return str(DTYPES[value]).replace("torch.", "") if 0 <= value < len(DTYPES) else "other"
    if field == "layout":
        return LAYOUT_WORDS.get(value, f"sequence dim {value}")
    if field == "mode":
        return Mode(value).words
    if field == "device":
        return device_name(value)
    if field == "scale":
        return repr(struct.unpack("<d", struct.pack("<q", value))[0])
    if field == "kernel":
        return repr(words["kernel"]) if words.get("kernel") else f"kernel #{value % 10007}"
    if field == "docs" and words.get("docs"):
        return words["docs"]
    if field == "graphs":
        return ("off", "on", "auto")[value] if 0 <= value <= 2 else "invalid"
    if field in ("validate", "transport"):
        codes = VALIDATE_CODES if field == "validate" else TRANSPORT_CODES
        return {i: name for name, i in codes.items()}.get(value, "invalid")
    if field == "split":
        return words.get("split") or split_words(value)
    if field == "chunks" and value < 1:
        return "an invalid value"
    return str(value)
