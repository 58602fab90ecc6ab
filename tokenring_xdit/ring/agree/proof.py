"""A call's split, and how this rank knows it (`call_split`, before the agreement): the given
`split=`, or the zigzag split `positions=` prove; its documents with it or as cu_seqlens /
position ids. What does not fit is a `Problem`, raised on every rank alike. Positions cost one
host sync (they are usually on the GPU).
"""

from __future__ import annotations

import torch

from ..split.sharding import shard_positions
from ..split.value import CONTIGUOUS, DOCUMENTS, PLAIN, POSITIONS, ZIGZAG, Documents, Split
from .problems import Problem

__all__ = ["call_split"]

_PLAIN = Split()
Found = tuple[Split, Problem, str]  # the call's split, its problem, the problem's words


def call_split(options, rank: int, size: int, q_len: int) -> Found:
    """This rank's split of a call (`options`: its split, positions, cu_seqlens, position_ids
    and causal flag) on a ring of `size` with `q_len` local queries."""
    split, positions = options.split, options.positions
    causal = options.causal and size > 1
    # the common case: nothing given (all four None), nothing to check
    if not causal and split is positions is options.cu_seqlens is options.position_ids is None:
        return _PLAIN, Problem.NONE, ""
    docs, problem, text = _documents(options.cu_seqlens, options.position_ids)
    if problem:
        return _PLAIN, problem, text
    if split is None or split.kind == PLAIN:
        split, problem = _unproven(positions, docs, causal, size, q_len)
    else:
        split, text = _given(split, docs, options.position_ids is not None, causal, size)
        problem = Problem.SPLIT if text else Problem.NONE
    if not problem and causal and split.kind == ZIGZAG and q_len % 2:
        problem = Problem.NOT_ZIGZAG  # a zigzag shard is two equal halves
    if problem or not causal or positions is None:
        return split, problem, text
    if not _matches(positions, split, rank, q_len):  # (given, or the split they would prove)
        return split, Problem.BAD_POSITIONS, split.kind
    return split, Problem.NONE, ""


def _documents(cu_seqlens, position_ids) -> tuple[Documents | None, Problem, str]:
    """(checked documents from cu_seqlens, problem, its words)."""
    if cu_seqlens is None:
        if position_ids is not None and not isinstance(position_ids, torch.Tensor):
            return None, Problem.POSITION_IDS, ""
        return None, Problem.NONE, ""
    try:
        return Documents.of(cu_seqlens), Problem.NONE, ""
    except (ValueError, TypeError) as exc:
        return None, Problem.CU_SEQLENS, str(exc).splitlines()[0][:300]


def _unproven(positions, docs, causal: bool, size: int, q_len: int) -> tuple[Split, Problem]:
    """No split given: plain (any cut serves a non-causal call or a ring of one), or the zigzag
    split a causal call's positions would prove (`call_split` checks them)."""
    if not causal:
        return _PLAIN.with_docs(docs), Problem.NONE
    if q_len % 2 or not q_len:
        return _PLAIN.with_docs(docs), Problem.NOT_ZIGZAG
    if positions is None:
        return _PLAIN.with_docs(docs), Problem.NO_PROOF
    return Split(kind=ZIGZAG, total=q_len * size, world_size=size, docs=docs, proof=POSITIONS), (
        Problem.NONE
    )


def _given(split: Split, docs, by_position_ids: bool, causal: bool, size: int):
    """(the given split with the call's documents, "" or why it does not fit the call)."""
    if split.world_size != size:
        return split, f"it is {split.words}, but this ring has {size} ranks"
    if docs is not None and split.docs is not None and docs != split.docs:
        return split, "cu_seqlens differ from the split's documents (pass one of them)"
    split = split.with_docs(docs)
    packed = split.docs is not None or by_position_ids
    if split.kind == DOCUMENTS and split.docs is None:
        return split, (
            "the documents layout needs the documents as cu_seqlens of the whole row (position "
            "ids that restart cannot place the pieces): make_split(..., cu_seqlens=cu)"
        )
    if causal and split.kind == CONTIGUOUS and not packed:
        return split, (
            "causal=True over contiguous shards needs the row's documents (cu_seqlens) to know "
            "which blocks attend; cut a dense row with make_split(S, N, causal=True, "
            "layout='contiguous') (one document) or make_split(S, N, causal=True) (zigzag)"
        )
    if size > 1 and not causal and split.kind == ZIGZAG and packed:
        return split, (
            "packed documents on zigzag shards need causal=True; a non-causal packed call takes "
            "contiguous shards or the documents layout (make_split(..., causal=False))"
        )
    return split, ""


def _matches(positions: torch.Tensor, split: Split, rank: int, q_len: int) -> bool:
    """Whether `positions` ((s,) or (b, s)) are this rank's under `split`."""
    pos = positions.reshape(-1, positions.shape[-1]) if positions.dim() > 1 else positions[None]
    if pos.shape[-1] != q_len or q_len * split.world_size != split.total:
        return False
    want = shard_positions(split, rank, device=pos.device)
    return bool((pos == want).all())  # one host sync
