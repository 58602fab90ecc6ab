"""Causal TokenRing on contiguous shards of a packed row, as pure functions of (rank, world_size).

Note: rank r holds the r-th of N contiguous equal shards of the row (packed documents only: the
call's DocPlan says which blocks attend). Q moves to r-1, so at step s rank r holds Q of
j = r+s (mod N). K/V never move.

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

import functools

from .blocks import ALL, BlockSchedule, BlockStep


@functools.cache
def _block_steps(rank: int, world_size: int) -> tuple[BlockStep, ...]:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a ring of {world_size}")
    n, r = world_size, rank
    plan = []
    for s in range(n + (1 if n > 1 else 0)):
        kernel = s < n
        more_q = s + 1 < n
        returns = s >= 2
        plan.append(
            BlockStep(
                step=s,
                kernel=kernel,
                q_owner=(r + s) % n if kernel else None,
                q_part=ALL,
                kv_part=ALL,
                causal=s == 0,
                q_send_to=(r - 1) % n if more_q else None,
                q_recv_from=(r + 1) % n if more_q else None,
                q_recv_owner=(r + s + 1) % n if more_q else None,
                ret_send_to=(r + s - 1) % n if returns else None,
                ret_recv_from=(r - s + 1) % n if returns else None,
            )
        )
    return tuple(plan)


CAUSAL_CONTIGUOUS = BlockSchedule("contiguous", True, _block_steps)
block_steps = _block_steps
