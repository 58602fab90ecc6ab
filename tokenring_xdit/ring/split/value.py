"""The split: how one sequence is cut across the ring, as one immutable value.

A `Split` names the cut (`kind`), the global length (`total`), the ring size (`world_size`),
the packed documents of the whole row (`docs`, or None) and how a rank knows (`proof`). Equal on
every rank, it is one argument of a call (`split=`) and one field of the agreed header (`code`;
the documents travel as a digest beside it): no process-wide table decides a later call.
Kinds, for rank r of N: "zigzag" (chunks r and 2N-1-r of 2N), "contiguous" (the r-th of N),
"documents" (pieces r and 2N-1-r of every document, ring/packed/doc_split.py), "plain" (no
claim: non-causal attention is exact on any cut; packed documents are then taken in rank
order). Proofs: "cut" (`make_split`, cut by `shard` / `shard_batch`), "positions" (the call's
positions matched it), "host" (a host's contract: yunchang's `token_ring` ring function takes
the zigzag shards its EXTRACT_FUNC_DICT["token_ring"] cuts).
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass, replace
from types import MappingProxyType

import torch

__all__ = [
    "Split", "Documents", "KINDS", "ZIGZAG", "CONTIGUOUS", "DOCUMENTS", "PLAIN", "CUT",
    "POSITIONS", "HOST", "PROOFS", "split_words",
]  # fmt: skip

ZIGZAG, CONTIGUOUS, DOCUMENTS, PLAIN = "zigzag", "contiguous", "documents", "plain"
KINDS = (PLAIN, ZIGZAG, DOCUMENTS, CONTIGUOUS)  # a kind's index is its header code
CUT, POSITIONS, HOST = "cut", "positions", "host"
PROOFS = ("", CUT, POSITIONS, HOST)
_PROOF_WORDS = MappingProxyType({CUT: "cut by tokenring_xdit.shard",
                                 POSITIONS: "proved by positions", HOST: "the host's contract"})


@dataclass(frozen=True)
class Documents:
    """The document boundaries of the global sequence (cu_seqlens as a tuple of ints)."""

    bounds: tuple[int, ...]

    @property
    def total(self) -> int:
        return self.bounds[-1]

    @property
    def count(self) -> int:
        return len(self.bounds) - 1

    @classmethod
    def of(cls, cu_seqlens, total: int | None = None) -> Documents:
        """Checked Documents from cu_seqlens (tensor or sequence of ints); ValueError says why.
        Zero-length documents are dropped (they attend nothing)."""
        if isinstance(cu_seqlens, torch.Tensor):
            if cu_seqlens.dim() != 1 or cu_seqlens.is_floating_point():
                raise ValueError("cu_seqlens must be a 1-d integer tensor")
            cu_seqlens = cu_seqlens.tolist()  # a host read (keep it on the CPU: docs)
        if isinstance(cu_seqlens, list | tuple) and all(type(x) is int for x in cu_seqlens):
            return _checked(tuple(cu_seqlens), total)  # the same offsets every layer and call
        return _check([int(x) for x in cu_seqlens], total)

    def doc_at(self, index: int) -> int:
        """Document number of global token `index`."""
        return bisect.bisect_right(self.bounds, index) - 1


def _check(bounds: list[int] | tuple[int, ...], total: int | None) -> Documents:
    """Documents.of's checks of plain ints (ValueError says why)."""
    if len(bounds) < 2 or bounds[0] != 0:
        raise ValueError(
            f"cu_seqlens must start at 0 and have >= 2 entries, got {list(bounds[:8])}"
        )
    if any(b > a for a, b in zip(bounds[1:], bounds, strict=False)):
        raise ValueError("cu_seqlens must be non-decreasing (document offsets)")
    if total is not None and bounds[-1] != total:
        raise ValueError(
            f"cu_seqlens ends at {bounds[-1]} but the global sequence has {total} tokens "
            "(cu_seqlens describe the WHOLE packed sequence, not this rank's shard; pad with "
            "a last document to reach the padded length)"
        )
    return Documents(tuple(dict.fromkeys(bounds)))  # drops repeats, keeps order


@functools.lru_cache(maxsize=64)  # bounded; an error is raised again (never cached)
def _checked(bounds: tuple[int, ...], total: int | None) -> Documents:
    return _check(bounds, total)


@dataclass(frozen=True, kw_only=True, slots=True)
class Split:
    """How one sequence is cut across a ring of `world_size` ranks (module docstring); `docs`
    may be left to the call (cu_seqlens=, position_ids=). ValueError for one no cut can have."""

    kind: str = PLAIN
    total: int = 0
    world_size: int = 0
    docs: Documents | None = None
    proof: str = ""

    def __post_init__(self) -> None:
        if why := _invalid(self.kind, self.total, self.world_size, self.proof):
            raise ValueError(f"Split: {why}")

    @property
    def code(self) -> int:
        """The agreed header field: the kind and the global length in one int."""
        return KINDS.index(self.kind) + len(KINDS) * self.total

    @property
    def words(self) -> str:
        """The split as errors name it."""
        if self.kind == PLAIN:
            return "no split (plain shards)"
        return f"{split_words(self.code)} over {self.world_size} ranks, {_PROOF_WORDS[self.proof]}"

    def with_docs(self, docs: Documents | None) -> Split:
        return self if docs is None or docs == self.docs else replace(self, docs=docs)

    def encoded(self) -> torch.Tensor:
        """Without its documents (they travel as the cu_seqlens tensor), as a compiled graph's
        argument: a tensor, so a length the graph takes as symbolic still encodes."""
        fields = (KINDS.index(self.kind), self.total, self.world_size, PROOFS.index(self.proof))
        return torch.tensor(fields, dtype=torch.int64)

    @staticmethod
    def decoded(fields: torch.Tensor) -> Split:
        return _decoded(tuple(fields.tolist()))


@functools.lru_cache(maxsize=64)
def _decoded(fields: tuple[int, ...]) -> Split:
    kind, total, size, proof = fields
    return Split(kind=KINDS[kind], total=total, world_size=size, proof=PROOFS[proof])


def _invalid(kind: str, total: int, n: int, proof: str) -> str:
    """Why these fields make no split ("" if they do)."""
    if kind not in KINDS or proof not in PROOFS:
        return f"kind must be one of {KINDS} and proof one of {PROOFS}, got {kind!r}, {proof!r}"
    if kind == PLAIN:
        return "" if (total, n, proof) == (0, 0, "") else "a plain split has no length or proof"
    if not proof or n < 1 or total < 1:
        return f"a {kind} split needs a proof, a ring size >= 1 and a length >= 1"
    pieces = n if kind == CONTIGUOUS else 2 * n
    if total % pieces:
        return f"a {kind} split of {total} tokens over {n} ranks needs a multiple of {pieces}"
    return ""


def split_words(code: int) -> str:
    """A header's split field in words ("the zigzag split of 16 tokens", "no split")."""
    kind, total = KINDS[code % len(KINDS)], code // len(KINDS)
    return "no split" if kind == PLAIN else f"the {kind} split of {total} tokens"
