"""Causal TokenRing on contiguous shards of a packed row, as pure functions of (rank, world_size).

Note: rank r holds the r-th of N contiguous equal shards of the row (packed documents only: the
call's DocPlan says which blocks attend). The table is the zigzag's (schedules/zigzag.py) with
every part whole: Q moves to r-1, so at step s rank r holds Q of j = r+s (mod N). K/V never
move.

  Q_j against K/V_r:
    j == r (step 0): the causal diagonal, every local document causally masked
    j >  r (no wrap, r+s < N): every key of shard r precedes every query of shard j
           -> full rectangles of the documents that reach from shard r into shard j
    j <  r (wrapped): every key follows every query -> nothing (an empty block: the plan
           skips it, and a Q that no later holder needs stops travelling)

  So a document inside one shard never leaves its rank, and a document that crosses shard
  boundaries costs its queries one hop per shard it reaches back: on a row whose documents
  are short against a shard almost every Q stops after one hop or none. Unlike the zigzag
  (schedules/zigzag.py) the shards' work is not balanced by the split: the order documents are
  packed in balances it (`pack_order.balanced_order(..., split="contiguous")`), and `auto`
  prices the layouts (documents.py). Never for a dense causal row: its wrapped blocks hold
  keys after queries.

  Who does what (N = 4, every document crossing every boundary; "-" an empty block):

  step | rank 0         | rank 1          | rank 2          | rank 3
  -----+----------------+-----------------+-----------------+----------------
   0   | Q0 x KV0 diag  | Q1 x KV1 diag   | Q2 x KV2 diag   | Q3 x KV3 diag
   1   | Q1 x KV0       | Q2 x KV1        | Q3 x KV2        | -  (Q0)
   2   | Q2 x KV0       | Q3 x KV1        | -  (Q0)         | -  (Q1)
   3   | Q3 x KV0       | -  (Q0)         | -  (Q1)         | -  (Q2)

  Lanes at step s on rank r (both posted before the kernel, waited after it):
    Q lane:      held Q -> r-1 ;  Q_{r+s+1} <- r+1            (only while a later holder needs it)
    return lane: partial of step s-1 -> its owner r+s-1 ;  partial of our Q <- r-s+1
                 (s >= 2, only for blocks that attended; one extra row s = N returns the last)
  Totals per pass, at most: N kernels, N-1 Q transfers, N-1 returns, no self-sends.
  The packed plan (doc_blocks.doc_plan) also trims what travels: a query goes on with only the
  prefix of its rows that its later holders attend (`blocks.Rows`: the rows of the document
  that crosses into its shard), and each partial comes home at the size its holder held.
"""

from __future__ import annotations

import dataclasses
import functools

from . import zigzag
from .blocks import ALL, BlockSchedule, BlockStep

# every part whole: a contiguous shard has no halves to pick
_WHOLE = dict(q_part=ALL, kv_part=ALL, q_send_part=ALL, q_recv_part=ALL, ret_send_part=ALL,
              ret_recv_part=ALL)  # fmt: skip


@functools.cache
def _block_steps(rank: int, world_size: int) -> tuple[BlockStep, ...]:
    """The zigzag's who-sends-what (Q to r-1, partials home one step late), every part whole."""
    return tuple(dataclasses.replace(st, **_WHOLE) for st in zigzag.block_steps(rank, world_size))


CAUSAL_CONTIGUOUS = BlockSchedule("contiguous", True, _block_steps)
block_steps = _block_steps
