"""TokenRing's non-causal schedule as pure functions of (rank, world_size, step).

Note: who sends what to whom (N = 4 ring ranks, seen from rank r, indices mod N).
P(j, r) is the partial (out, lse) of attention(Q_j, K_r, V_r); K/V never move.
Both lanes are posted before the step's kernel and waited after it.

  step | kernel on r         | Q lane                         | out lane
  -----+---------------------+--------------------------------+------------------------------
   0   | P(r,   r) (own Q)   | Q_r   -> r+1 ; Q_r-1 <- r-1    | -
   1   | P(r-1, r)           | Q_r-1 -> r+1 ; Q_r-2 <- r-1    | -   (P(r, r) stays home)
   2   | P(r-2, r)           | Q_r-2 -> r+1 ; Q_r-3 <- r-1    | P(r-1, r) -> r-1
       |                     |                                | P(r, r+1) <- r+1
   3   | P(r-3, r) in chunks | piece c of P(r-3, r) -> r+1    | P(r-2, r) -> r-2
       |                     | piece c of P(r, r+3) <- r-1    | P(r, r+2) <- r+2
  (At the last step the Q lane is idle and the last partial goes home the way Q went,
   r -> r+1 = r-3, so its pieces reuse that communicator.)

Each partial returns to its owner one step late, so the transfer hides behind the next kernel.
The last one has no next kernel: it can leave in chunks as each is computed (`final_chunks`),
and a share of our own queries can be held back (`defer_own`): step 0 then runs P(r, r) for
the first queries only, and the rest of P(r, r) runs at the last step after its pieces are
sent, so the last return travels behind it. Neither changes who sends what; nor does the head
start (ring/head_start.py), a pause before a kernel that follows a return so that the return's
transfer gets its SMs first.
Totals per forward: N kernels (+1 when holding back), N-1 Q transfers, N-1 partial returns,
no self-sends.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    """What rank `rank` does at `step` (all ranks are ring-group ranks)."""

    step: int
    q_owner: int  # owner of the Q this rank runs the kernel on at this step
    q_send_to: int | None  # Q lane: forward the held Q for the next step
    q_recv_from: int | None
    q_recv_owner: int | None  # whose Q arrives (its length sizes the receive buffer)
    ret_send_to: int | None  # out lane: the previous step's partial goes home
    ret_recv_from: int | None  # who computed the partial of our own Q that arrives now


@functools.cache
def _steps(rank: int, world_size: int) -> tuple[Step, ...]:
    """The whole forward for one rank. The last step's return is `final_return`."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a ring of {world_size}")
    n = world_size
    plan = []
    for s in range(n):
        more_q = s + 1 < n
        # The partial computed at step s-1 belongs to rank-(s-1); step 0's is our own.
        returns = s >= 2
        plan.append(
            Step(
                step=s,
                q_owner=(rank - s) % n,
                q_send_to=(rank + 1) % n if more_q else None,
                q_recv_from=(rank - 1) % n if more_q else None,
                q_recv_owner=(rank - s - 1) % n if more_q else None,
                ret_send_to=(rank - (s - 1)) % n if returns else None,
                ret_recv_from=(rank + (s - 1)) % n if returns else None,
            )
        )
    return tuple(plan)


def _final_return(rank: int, world_size: int) -> tuple[int, int] | None:
    """(send_to, recv_from) for the last step's partial, or None when N = 1."""
    n = world_size
    if n == 1:
        return None
    return (rank - (n - 1)) % n, (rank + (n - 1)) % n


def chunk_bounds(length: int, chunks: int) -> list[tuple[int, int]]:
    """Split [0, length) into at most `chunks` near-equal, non-empty pieces.

    Sender and receiver call this with the same length (the Q owner's), so pieces match.
    """
    chunks = max(1, min(chunks, length))
    base, extra = divmod(length, chunks)
    bounds, start = [], 0
    for c in range(chunks):
        end = start + base + (1 if c < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


# defer_own=None ("auto"): the share of the own block held back, by a rank's query count:
# (at least this many queries, share), largest first. Measured at ring 2 on 4 x H200 with the
# head start on (docs/performance.md, design decisions): a quarter held back was
# 5-9 % faster at 2048-4096 local queries (half: up to 4 % slower there), half 3-8 % faster
# from 8192; below 2048 not measured at ring 2, so nothing is held back.
AUTO_DEFER = ((8192, 0.5), (2048, 0.25))


def held_back(length: int, defer_own: float | None) -> int:
    """How many of a rank's `length` queries run their own block last (0: none; `defer_own`
    None: AUTO_DEFER). Local: the own block never travels, so ranks with other lengths or
    settings still match. The forward loop (ring/inference/loop.py) and the planner both use it."""
    if defer_own is None:
        defer_own = next((share for least, share in AUTO_DEFER if length >= least), 0.0)
    if defer_own <= 0 or length < 2:
        return 0
    return min(length - 1, max(1, round(length * defer_own)))


class NonCausal:
    """The schedule object the forward loop takes (`steps`, `final_return`)."""

    name = "token_ring"
    steps = staticmethod(_steps)
    final_return = staticmethod(_final_return)


NON_CAUSAL = NonCausal()
# module-level names kept for tests and readers of the table above
steps = _steps
final_return = _final_return
