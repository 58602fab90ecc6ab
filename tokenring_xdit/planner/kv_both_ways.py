"""Training calls (forward + backward) of both ring families, simulated step by step.

TokenRing moves queries and partials (ring/schedules/zigzag.py and blocks.py: Q, then Q, dO,
lse, delta one hop per step; (out, lse), then dQ home); the K/V family moves K/V halves both
ways round the ring (ring/schedules/kv_both_ways.py: a half each way per step; the backward's
dK/dV sums one step behind them). Each family runs its own table on every ring rank, with the
same ingredients as the forward simulation (schedules.py, docs/planner.md):

- kernels: the calibration table's measured forward block (cuDNN, its head count: the K/V
  family's head halves run H/2 heads), the causal diagonal at CAUSAL_OVER_FULL of the full
  block, the backward at TRAIN_OVER_FORWARD - 1 times the forward (ceiling.py: one H200);
- links: the fabric's patterns (a rank sending to two peers at once: `two_peers`), a transfer
  starting when both ends posted it, each row waiting for its transfers and kernels;
- the kernel's loss per MB moved under it (params.overlap_us_per_mb);
- memory passes at the GPU's HBM rate: merges, sums, the O stand-in, delta, and a graphed call's
  copies in and out (the measured graphed TokenRing pays them; the K/V family is priced the
  same, as if graphed).
The host is left out: this is a graphed call's GPU time (the eager path adds the host's issue
time, docs/training.md). GQA's per-block K/V expansion is the same in both and left out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from ..ring.schedules import CAUSAL_ZIGZAG, NON_CAUSAL_BLOCKS
from ..ring.schedules.blocks import FRONT, part_len
from ..ring.schedules.kv_both_ways import (
    KvStep,
    front_len,
    half_ranges,
    kv_steps,
    split_by_heads,
)
from .ceiling import CAUSAL_OVER_FULL, TRAIN_OVER_FORWARD
from .machine import Machine, make_machine
from .schedules import LSE_BYTES, _flows_ms

__all__ = ["TrainShape", "FAMILIES", "train_ms", "pass_bytes", "choose_travel"]

BWD_OVER_FWD = TRAIN_OVER_FORWARD - 1
FAMILIES = ("token_ring", "kv_both_ways")


@dataclass(frozen=True)
class TrainShape:
    """One training call on each ring rank: `tokens` local tokens (causal: a zigzag shard),
    `heads` query and `kv_heads` K/V heads, bf16 by default."""

    heads: int
    kv_heads: int
    head_dim: int
    tokens: int
    causal: bool
    dtype_bytes: int = 2
    dtype: str = "bfloat16"


# one rank's row: (kernel ms, memory ms, flows [(ring rank, bytes)])
Row = tuple[float, float, list]


def _fwd_ms(m: Machine, s: TrainShape, q: int, kv: int, heads: int, diag: bool = False) -> float:
    ms = m.table.block_ms(q, kv, heads, s.head_dim, s.dtype)
    return ms * CAUSAL_OVER_FULL if diag and s.causal else ms


def _simulate(m: Machine, ranks: list[int], rows: list[list[Row]]) -> tuple[float, dict]:
    """End of the last row (slowest rank) when every rank runs its rows; (ms, parts)."""
    n, start = len(ranks), [0.0] * len(ranks)
    kernels = comm = 0.0
    for row in rows:
        ends, comm_ms = list(start), [0.0] * n
        for i, (_, _, flows) in enumerate(row):
            if flows:
                dur = _flows_ms(m, ranks[i], [(ranks[j], nb) for j, nb in flows], "ring")
                for j, _ in flows:
                    t = max(start[i], start[j]) + dur
                    ends[i], ends[j] = max(ends[i], t), max(ends[j], t)
                comm_ms[i] = dur
        for i, (k, mem, flows) in enumerate(row):
            sent = sum(nb for _, nb in flows)
            under = sent * min(1.0, k / comm_ms[i]) if comm_ms[i] > k else sent
            k += m.params.overlap_us_per_mb * under / 1e9 if k > 0 else 0.0
            ends[i] = max(ends[i], start[i] + k + mem)
        kernels += row[0][0]
        comm += max(comm_ms)
        start = ends
    return max(start), {"kernels": kernels, "comm": comm}


def _token_ring_rows(m: Machine, s: TrainShape, n: int, backward: bool) -> list[list[Row]]:
    """Every rank's rows of TokenRing's block table (Q lane and return lane)."""
    table = CAUSAL_ZIGZAG if s.causal else NON_CAUSAL_BLOCKS
    e, d, h, L = s.dtype_bytes, s.head_dim, s.heads, s.tokens
    q_per = 2 * d * e + 2 * LSE_BYTES if backward else d * e  # (Q, dO, lse, delta) or Q
    ret_per = d * e if backward else d * e + LSE_BYTES  # dQ or (out, lse)
    acc = 4 if n > 2 else e
    rows = [[] for _ in range(n + 1)]
    for r in range(n):
        for st in table.block_steps(r, n):
            k = mem = 0.0
            flows = []
            if st.kernel:
                q, kv = part_len(st.q_part, L), part_len(st.kv_part, L)
                k = _fwd_ms(m, s, q, kv, h, st.causal) * (BWD_OVER_FWD if backward else 1)
                if backward:  # the stand-in (travelling blocks) and the dK/dV sums
                    standin = q * h * 2 * d * e if st.step else 0
                    mem += standin + 2 * kv * s.kv_heads * d * (2 * acc + e)
            if st.q_send_to is not None:
                flows.append((st.q_send_to, part_len(st.q_send_part, L) * h * q_per))
            if st.ret_send_to is not None:
                flows.append((st.ret_send_to, part_len(st.ret_send_part, L) * h * ret_per))
            if st.ret_recv_from is not None:  # the partial (dQ) that came home, summed
                rows_home = part_len(st.ret_recv_part, L) * h
                mem += rows_home * (d * (2 * acc + e) if backward else d * (e + 8) + 3 * 4)
            rows[st.step].append((k, m.mem_ms(mem), flows))
    return [row for row in rows if row]


def _kv_rows(m: Machine, s: TrainShape, n: int, backward: bool) -> list[list[Row]]:
    """Every rank's rows of the K/V family's table (a half each way, sums behind them)."""
    heads = half_shape(s)[0].heads

    def block_ms(r: int, st: KvStep, x: int, q: int, kv: int) -> float:
        if st.diagonal:
            return _fwd_ms(m, s, s.tokens, s.tokens, s.heads, True)
        return _fwd_ms(m, s, q, kv, heads)

    tables = [kv_steps(r, n, s.causal) for r in range(n)]
    return [[kv_row(m, s, n, r, st, backward, block_ms) for r, st in enumerate(sts)]
            for sts in zip(*tables, strict=True) if backward or sts[0].kernel]  # fmt: skip


def half_shape(s: TrainShape) -> tuple[TrainShape, list[int]]:
    """(a half's shape: its query and K/V heads, the tokens of halves A and B) as the family
    cuts them (`split_by_heads`, `half_ranges`)."""
    by_heads = split_by_heads(s.kv_heads)
    half = replace(s, heads=s.heads // 2, kv_heads=s.kv_heads // 2) if by_heads else s
    ranges = half_ranges(s.tokens, s.causal, by_heads)
    return half, [sum(b - a for a, b in ranges[x]) for x in (0, 1)]


def kv_row(m: Machine, s: TrainShape, n: int, r: int, st: KvStep, backward: bool,
           block_ms) -> Row:  # fmt: skip
    """Rank `r`'s row `st` of the K/V family (the full table's, or a plan's with only the
    transfers its blocks need): its kernels (`block_ms(r, st, half, q_rows, kv_rows)`: ms, None
    where the block is not run; the diagonal's at step 0), the K/V and dK/dV transfers the row
    posts, and the memory passes of the merges, the sums and the sums that come home."""
    hs, tokens = half_shape(s)
    e, d, L = s.dtype_bytes, s.head_dim, s.tokens
    travel = 4 if n > 2 else e  # the sums travel in fp32 beyond two ranks
    k = block_ms(r, st, 0, L, L) if st.diagonal else 0.0
    mem, flows = 0.0, []
    for x, half in enumerate(st.halves):
        if st.kernel and not st.diagonal:
            q = part_len(half.q_part, L)
            kv = front_len(L, x, s.causal, split_by_heads(s.kv_heads)) if half.kv_part == FRONT \
                else tokens[x]  # fmt: skip
            ms = block_ms(r, st, x, q, kv)
            if ms is not None:
                k += ms
                mem += q * hs.heads * (d * (2 * 4 + e) if backward else d * (e + 8) + 3 * 4)
                if backward:  # the half's running dK/dV sum
                    mem += 2 * kv * hs.kv_heads * d * (2 * travel + e)
        if half.send_to is not None:
            flows.append((half.send_to, 2 * tokens[x] * hs.kv_heads * d * e))
        if backward and half.grad_send_to is not None:
            flows.append((half.grad_send_to, 2 * tokens[x] * hs.kv_heads * d * travel))
        home = half.home_from is not None or (not st.kernel and half.grad_recv_from is not None)
        if backward and home:  # our own half's sum came home
            mem += 2 * tokens[x] * hs.kv_heads * d * (8 + travel)
    return (k * (BWD_OVER_FWD if backward else 1), m.mem_ms(mem), flows)


def _copies_ms(m: Machine, s: TrainShape, backward: bool) -> float:
    """A graphed pass's copies into its buffers and out of them, and delta's pass (backward)."""
    q, kv = s.heads * s.head_dim * s.dtype_bytes, s.kv_heads * s.head_dim * s.dtype_bytes
    if not backward:  # q, k, v in; out, lse out
        return m.mem_ms(s.tokens * 2 * (2 * q + 2 * kv + s.heads * LSE_BYTES))
    # dO, q, k, v, out, lse in; dq, dk, dv out; delta = rowsum(dO * O)
    return m.mem_ms(s.tokens * (2 * (4 * q + 2 * kv + 2 * s.heads * LSE_BYTES) + 2 * q))


def train_ms(m: Machine, family: str, s: TrainShape, ranks: list[int]) -> dict:
    """Predicted GPU ms of one forward + backward call of `family` on the ring `ranks` (global
    ranks on `m`): {"ms", "fwd_ms", "bwd_ms", "kernels_ms", "comm_ms"}."""
    n = len(ranks)
    if family not in FAMILIES:
        raise ValueError(f"unknown ring family {family!r}; use one of {FAMILIES}")
    build = _token_ring_rows if family == "token_ring" else _kv_rows
    out = {}
    for name, backward in (("fwd", False), ("bwd", True)):
        if n == 1:
            k = _fwd_ms(m, s, s.tokens, s.tokens, s.heads, True)
            k *= BWD_OVER_FWD if backward else 1
            ms, parts = k, {"kernels": k, "comm": 0.0}
        else:
            ms, parts = _simulate(m, ranks, build(m, s, n, backward))
        out[f"{name}_ms"] = ms + _copies_ms(m, s, backward)
        for key, value in parts.items():
            out[f"{key}_ms"] = out.get(f"{key}_ms", 0.0) + value
    out["ms"] = out["fwd_ms"] + out["bwd_ms"]
    return out


def pass_bytes(family: str, s: TrainShape, n: int, backward: bool) -> float:
    """Bytes one rank sends at a middle step (both lanes together), equal lengths: what the
    table moves per step (the predicted table prints it beside the times)."""
    e, d = s.dtype_bytes, s.head_dim
    if family == "token_ring":
        q_per = 2 * d * e + 2 * LSE_BYTES if backward else d * e
        ret_per = d * e if backward else d * e + LSE_BYTES
        return s.tokens * s.heads * (q_per + ret_per)
    travel = 4 if n > 2 else e
    return 2 * s.tokens * s.kv_heads * d * (e + (travel if backward else 0))


# The K/V family must win by this much to be picked over TokenRing (the model's median error
# on the measured rows is 2-7 %; TokenRing is what every host ran so far).
TRAVEL_MARGIN = 0.02


@lru_cache(maxsize=256)
def choose_travel(s: TrainShape, ring: int, fabric: str = "nvswitch") -> tuple[str, str]:
    """("q" or "kv", why) for one training call of shape `s` on a ring of `ring` GPUs of one
    node on `fabric`: the K/V family where it is predicted MARGIN faster. A pure function of
    its arguments, so every rank that agreed them picks the same."""
    if ring < 2:
        return "q", "no ring"
    m = make_machine(ring, fabric_name=fabric)
    ranks = list(range(ring))
    tr, kv = (train_ms(m, family, s, ranks)["ms"] for family in FAMILIES)
    pick = "kv" if kv < tr * (1 - TRAVEL_MARGIN) else "q"
    return pick, f"predicted fwd+bwd {tr:.3f} ms moving Q vs {kv:.3f} ms moving K/V ({fabric})"
