"""Causal TokenRing on zigzag shards, as pure functions of (rank, world_size, step).

Note: rank r holds sequence chunks r and 2N-1-r (of 2N equal chunks): its FRONT and BACK half.
Q moves to r-1, so at step s rank r holds Q of j = r+s (mod N). K/V never move.

  Q_j against K/V_r, for j != r:
    j > r (no wrap, r+s < N): chunks j and 2N-1-j both lie after chunk r and before 2N-1-r
           -> full Q_j against the FRONT half of K/V_r
    j < r (wrapped, r+s >= N): chunk j sees nothing of K/V_r, chunk 2N-1-j sees all of it
           -> BACK half of Q_j against all of K/V_r
  Both are (S/2N) x (S/N) blocks, so every rank does the same work at every step; step 0 is
  the causal diagonal (our own Q against our own K/V, which keeps the global order).

  Because Q moves towards r-1, a Q runs through its full-Q holders first (j-1, ..., 0) and
  through its back-half holders after the wrap (N-1, ..., j+1): from rank 0 on only the back
  half travels.

  Who does what (N = 4; "Qj" full, "Qj.b" back half; F = front half of local K/V):

  step | rank 0         | rank 1          | rank 2          | rank 3
  -----+----------------+-----------------+-----------------+----------------
   0   | Q0 x KV0 diag  | Q1 x KV1 diag   | Q2 x KV2 diag   | Q3 x KV3 diag
   1   | Q1 x F0        | Q2 x F1         | Q3 x F2         | Q0.b x KV3
   2   | Q2 x F0        | Q3 x F1         | Q0.b x KV2      | Q1.b x KV3
   3   | Q3 x F0        | Q0.b x KV1      | Q1.b x KV2      | Q2.b x KV3

  Lanes at step s on rank r (both posted before the kernel, waited after it):
    Q lane:      held Q (the part r-1 needs next) -> r-1 ;  Q_{r+s+1} <- r+1
    return lane: partial of step s-1 -> its owner r+s-1 ;  partial of our Q <- r-s+1
                 (s >= 2; one extra row s = N returns the last partial, which has no kernel
                 left to hide behind)
  Totals per pass: N kernels, N-1 Q transfers, N-1 returns, no self-sends.
"""

from __future__ import annotations

import functools

from .blocks import ALL, BACK, FRONT, BlockSchedule, BlockStep


def _held_part(rank: int, step: int, n: int) -> str:
    """Part of Q_{rank+step} that `rank` holds at `step`: full until the Q has wrapped."""
    return ALL if rank + step < n else BACK


@functools.cache
def _block_steps(rank: int, world_size: int) -> tuple[BlockStep, ...]:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a ring of {world_size}")
    n, r = world_size, rank
    plan = []
    for s in range(n + (1 if n > 1 else 0)):
        kernel = s < n
        held = _held_part(r, s, n) if kernel else ALL
        more_q = s + 1 < n
        returns = s >= 2
        receiver = (r - 1) % n
        plan.append(
            BlockStep(
                step=s,
                kernel=kernel,
                q_owner=(r + s) % n if kernel else None,
                q_part=held,
                kv_part=ALL if s == 0 or held == BACK else FRONT,
                causal=s == 0,
                q_send_to=receiver if more_q else None,
                q_send_part=_held_part(receiver, s + 1, n) if more_q else ALL,
                q_recv_from=(r + 1) % n if more_q else None,
                q_recv_owner=(r + s + 1) % n if more_q else None,
                q_recv_part=_held_part(r, s + 1, n) if more_q else ALL,
                ret_send_to=(r + s - 1) % n if returns else None,
                ret_send_part=_held_part(r, s - 1, n) if returns else ALL,
                ret_recv_from=(r - s + 1) % n if returns else None,
                # the sender h = r-s+1 held our Q in full iff h + (s-1) < N, i.e. iff r >= s-1
                ret_recv_part=(ALL if r >= s - 1 else BACK) if returns else ALL,
            )
        )
    return tuple(plan)


CAUSAL_ZIGZAG = BlockSchedule("zigzag", True, _block_steps)
block_steps = _block_steps
