"""The K/V family: K/V travel both ways round the ring, Q, out and lse stay home.

Note: who sends what to whom (N = 4 ring ranks, seen from rank r, indices mod N).
KV_j (rank j's K and V) is cut in two halves of equal size: KV_j.a travels forward (to r+1),
KV_j.b backward (to r-1), so at step s rank r holds KV_{r-s}.a and KV_{r+s}.b, and each
direction of every link carries one half (L·Hkv·d elements of K and V together) per step. The
halves are K/V heads [0, Hkv/2) and [Hkv/2, Hkv) (with the query heads they serve) when the K/V
head count is even; else tokens (`half_ranges`). Forward lane = a's direction, backward lane = b's.

  step | kernels on r                        | forward lane (a)            | backward lane (b)
  -----+-------------------------------------+-----------------------------+----------------------------
   0   | Q_r x KV_r (the diagonal, one call) | KV_r.a -> r+1               | KV_r.b -> r-1
       |                                     | KV_r-1.a <- r-1             | KV_r+1.b <- r+1
   1   | Q_r x KV_r-1.a ; Q_r x KV_r+1.b     | KV_r-1.a -> r+1             | KV_r+1.b -> r-1
       |                                     | KV_r-2.a <- r-1             | KV_r+2.b <- r+1
   2   | Q_r x KV_r-2.a ; Q_r x KV_r+2.b     | KV_r-2.a -> r+1             | KV_r+2.b -> r-1
       |                                     | KV_r-3.a <- r-1             | KV_r+3.b <- r+1
   3   | Q_r x KV_r-3.a ; Q_r x KV_r+3.b     | -                           | -

Each step's partials merge into our own (out, lse) in fp32 by log-sum-exp: nothing goes home.

Backward (same rows, same peers): K/V travel again, and each half's dK/dV accumulator follows it
one step late on the same lane: the half's holder at step s adds its share to the accumulator
that arrives from the previous holder at that step (s >= 2) and posts the sum to the next holder
at step s+1; the last holder's sum reaches the owner on one more row (s = N, no kernel), where it
is added to the owner's own dK/dV of step 0. dQ never moves. So every transfer is one hop to a
neighbour, and each link direction carries per step one half of K/V and one half of dK/dV
(dKV_j.a: the sum so far of the dK/dV of KV_j.a):

  step | forward lane (a), besides K/V         | backward lane (b), besides K/V
  -----+---------------------------------------+---------------------------------------
   2   | dKV_r-1.a -> r+1 ; dKV_r-2.a <- r-1    | dKV_r+1.b -> r-1 ; dKV_r+2.b <- r+1
   3   | dKV_r-2.a -> r+1 ; dKV_r-3.a <- r-1    | dKV_r+2.b -> r-1 ; dKV_r+3.b <- r+1
   4   | dKV_r-3.a -> r+1 ; dKV_r.a <- r-1 home | dKV_r+3.b -> r-1 ; dKV_r.b <- r+1 home

Causal (zigzag shards: rank r holds chunks r and 2N-1-r of 2N, its FRONT and BACK half): for
KV_j with j != r, j < r -> all of Q_r against the part of KV_j's half that lies in chunk j (its
FRONT); j > r -> the BACK half of Q_r against all of the half. A head half's FRONT is chunk j; a
token half (`half_ranges` cuts each chunk in two) holds a piece of each chunk and its FRONT is
the piece of chunk j. Either way every block has the same area (L·L/2 pairs on H/2 heads, or
L·L/4 on all heads, for L local tokens), so every rank does the same work at every step, and no
block is masked but the diagonal.

  Holders of KV_j.a (forward) see FRONT while j < holder (before the wrap), ALL after; holders of
  KV_j.b (backward) see ALL until the wrap, FRONT after.

Totals per pass and direction: N-1 K/V half transfers (the backward: and N-1 dK/dV accumulator
transfers, the last one home); 2N-1 kernel calls (the diagonal, then two half blocks a step);
no self-sends.

Windows' note (a sliding window or packed documents: ring/packed/kv_plan.py says which blocks
have a visible pair; `kept_steps` keeps the rows' transfers they need). For KV_j's half, let
U be the steps 1..N-1 whose holder runs a block with it, and m = max U (0: none):
  - K/V: the hops of steps 0..m-1 only (holder s -> holder s+1); later holders get nothing.
  - dK/dV: for each run [a, b] of consecutive steps in U, holder a starts the sum, rows a+1..b
    carry it holder to holder (one hop, as above), and at row b+1 holder b sends it home to j:
    the neighbour at b = N-1 (row N, as above), else straight to j (`home_from`), which adds it
    to its own. Holders with no block neither receive nor send a sum.
Ring 4, causal zigzag, a window inside a chunk (W <= L/2, L local tokens): a head half of
KV_j is seen at step 1 (chunk j+1 sees the end of chunk j) and, after the wrap, at step 3
(chunk 2N-1-r sees the end of chunk 2N-1-j), not at step 2: it travels the whole way and its
sum makes two runs (home from step 1's holder at row 2, from step 3's at row 4); 16 of 28
kernels a pass (W = 3). Token halves with W - 1 <= L/4: those ends lie in B, so A never
leaves home (10 kernels). Non-causal contiguous shards, a left window inside a shard: A is
seen by r+1 at step 1 only (one hop); B by r+1 too, at step N-1, the long way round (a half's
direction is the table's).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from .blocks import ALL, BACK, FRONT

__all__ = [
    "A", "B", "HalfRow", "KvStep", "Used", "kv_steps", "kept_steps", "half_ranges", "front_len",
    "split_by_heads",
]  # fmt: skip

A, B = 0, 1  # the half that travels forward (to r+1) and the one that travels backward (to r-1)


@dataclass(frozen=True)
class HalfRow:
    """What one half does at one row on one rank. `owner`: whose half is held (its kernel runs
    on it: our queries `q_part` against the half's `kv_part`); `send_to`/`recv_from`: its K/V
    move for the next step (`recv_owner`: whose half arrives, which sizes the buffers);
    `grad_send_to`: where the accumulator made at the previous row goes (the next holder, or
    its owner: home); `grad_recv_from`: an accumulator arrives, to which this row's block adds
    (`grad_owner`: whose half it belongs to; ourselves at row N: home); `home_from`: our own
    half's accumulator comes home before row N, from the last holder of a run (`kept_steps`)."""

    owner: int | None
    q_part: str = ALL
    kv_part: str = ALL
    send_to: int | None = None
    recv_from: int | None = None
    recv_owner: int | None = None
    grad_send_to: int | None = None
    grad_recv_from: int | None = None
    grad_owner: int | None = None
    home_from: int | None = None


@dataclass(frozen=True)
class KvStep:
    """One row of a rank's table: step 0 runs the diagonal, steps 1..N-1 a block per half, the
    row N (N > 1, `kernel=False`) only brings the last dK/dV accumulators home."""

    step: int
    kernel: bool
    diagonal: bool
    halves: tuple[HalfRow, HalfRow]  # (A, B)


def split_by_heads(kv_heads: int) -> bool:
    """Halves by K/V heads when they pair up (each half then serves half the query heads), else
    by tokens."""
    return kv_heads >= 2 and kv_heads % 2 == 0


def half_ranges(length: int, causal: bool, by_heads: bool) -> tuple[tuple, tuple]:
    """(A's, B's) token ranges [(start, stop), ...] in a local K/V of `length`. By heads each
    half has every token. By tokens: non-causal, the first and second half; causal, each zigzag
    chunk cut in two (A the first part of each), so that either half meets the zigzag's
    queries in blocks of equal size (the Note)."""
    if by_heads:
        return ((0, length),), ((0, length),)
    if not causal:
        mid = length // 2
        return ((0, mid),), ((mid, length),)
    chunk = length // 2
    cut = chunk // 2
    return ((0, cut), (chunk, chunk + cut)), ((cut, chunk), (chunk + cut, length))


def front_len(length: int, half: int, causal: bool, by_heads: bool) -> int:
    """Tokens of a half's FRONT (its part in chunk j) for an owner of `length` local tokens:
    chunk j itself for a head half, its first token piece for a token half."""
    if by_heads:
        return length // 2
    first = half_ranges(length, causal, by_heads)[half][0]
    return first[1] - first[0]


def _parts(owner: int, rank: int) -> tuple[str, str]:
    """(q_part, kv_part) of a causal block of KV_owner's half on `rank` (owner != rank)."""
    if owner < rank:
        return ALL, FRONT
    return BACK, ALL


def _half(half: int, rank: int, n: int, s: int, causal: bool) -> HalfRow:
    ahead = 1 if half == A else -1  # the direction this half travels
    kernel = s < n
    owner = (rank - ahead * s) % n if kernel else None
    parts = _parts(owner, rank) if causal and kernel and s > 0 else (ALL, ALL)
    more = s + 1 < n
    grads = s >= 2  # the accumulator of step s-1 goes on (row N: home)
    return HalfRow(
        owner=owner,
        q_part=parts[0],
        kv_part=parts[1],
        send_to=(rank + ahead) % n if more else None,
        recv_from=(rank - ahead) % n if more else None,
        recv_owner=(rank - ahead * (s + 1)) % n if more else None,
        grad_send_to=(rank + ahead) % n if grads else None,
        grad_recv_from=(rank - ahead) % n if grads else None,
        grad_owner=(rank - ahead * s) % n if grads else None,
    )


@functools.cache
def kv_steps(rank: int, world_size: int, causal: bool) -> tuple[KvStep, ...]:
    """The whole table of `rank`: rows 0..N-1 with kernels, and for N > 1 the row N."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a ring of {world_size}")
    n = world_size
    rows = n + (1 if n > 1 else 0)
    return tuple(
        KvStep(s, s < n, s == 0, (_half(A, rank, n, s, causal), _half(B, rank, n, s, causal)))
        for s in range(rows)
    )


# [owner][half][step - 1]: whether the holder of owner's half at that step runs a block with it
Used = tuple[tuple[tuple[bool, ...], tuple[bool, ...]], ...]


@functools.lru_cache(maxsize=256)
def kept_steps(rank: int, world_size: int, causal: bool, used: Used) -> tuple[KvStep, ...]:
    """`rank`'s table with only the transfers some block needs (the windows' Note): a half
    travels while a later holder runs a block with it; its dK/dV sum goes from holder to holder
    within each run of holders with a block and home from the run's last holder."""
    return tuple(
        dataclasses.replace(st, halves=tuple(
            _kept(h, st.halves[h], rank, world_size, st.step, used) for h in (A, B)))
        for st in kv_steps(rank, world_size, causal)
    )  # fmt: skip


def _kept(half: int, row: HalfRow, rank: int, n: int, s: int, used: Used) -> HalfRow:
    ahead = 1 if half == A else -1

    def runs(owner: int, t: int) -> bool:  # the holder of owner's half at step t has a block
        return 1 <= t < n and used[owner % n][half][t - 1]

    def goes_on(owner: int) -> bool:  # a holder after step s needs owner's half
        return any(runs(owner, t) for t in range(s + 1, n))

    prev = (rank - ahead * (s - 1)) % n  # whose sum we made at the previous row
    send = None
    if runs(prev, s - 1):
        send = (rank + ahead) % n if runs(prev, s) else prev
    passed = runs(row.owner, s) and runs(row.owner, s - 1) if s < n else runs(rank, n - 1)
    home = s < n and runs(rank, s - 1) and not runs(rank, s)
    return dataclasses.replace(
        row,
        send_to=row.send_to if row.send_to is not None and goes_on(row.owner) else None,
        recv_from=row.recv_from if row.recv_from is not None and goes_on(row.recv_owner)
        else None,
        grad_send_to=send,
        grad_recv_from=row.grad_recv_from if passed else None,
        home_from=(rank + ahead * (s - 1)) % n if home else None,
    )  # fmt: skip
