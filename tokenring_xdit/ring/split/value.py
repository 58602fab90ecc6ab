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

import functools
from dataclasses import dataclass, replace

import torch

from ..packed import CONTIGUOUS, DOCUMENTS, Documents, normal_split
from ..packed import ROW as ZIGZAG

__all__ = [
    "Split", "Documents", "KINDS", "ZIGZAG", "CONTIGUOUS", "DOCUMENTS", "PLAIN", "CUT",
    "POSITIONS", "HOST", "PROOFS", "split_words",
]  # fmt: skip

PLAIN = "plain"  # (the other kinds are ring/packed's layout names)
KINDS = (PLAIN, ZIGZAG, DOCUMENTS, CONTIGUOUS)  # a kind's index is its header code
CUT, POSITIONS, HOST = "cut", "positions", "host"
PROOFS = ("", CUT, POSITIONS, HOST)


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
        how = "cut by tokenring_xdit.shard" if self.proof == CUT else "the host's contract"
        how = "proved by positions" if self.proof == POSITIONS else how
        return f"{split_words(self.code)} over {self.world_size} ranks, {how}"

    def layout(self, causal: bool, size: int) -> str:
        """The packed layout shards cut so run in (plain: contiguous shards in rank order)."""
        return normal_split(ZIGZAG if self.kind == PLAIN else self.kind, causal, size)

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
