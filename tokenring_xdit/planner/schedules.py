"""The ring schedules, simulated step by step on every rank (GPU time of one attention call).

Each simulation keeps, per ring rank, the time its step starts; a transfer starts when both ends
have posted it (NCCL send/recv rendezvous) and lasts latency + bytes / bandwidth of the pattern
the whole ring runs at that step (fabric.py); a kernel loses a measured time per MB that NCCL
moves while it runs (params.overlap_us_per_mb). Ranks are global ranks, so hops that cross nodes
take the inter-node fabric and the slowest hop sets the pace - nothing assumes a uniform ring.

    step s on rank r          TokenRing                     K/V ring (yunchang)
    ------------------------  ----------------------------  ---------------------------
    before the kernel         post Q_{r-s} -> r+1,          post K,V -> r+1,
                              partial of step s-1 -> r-s+1  K,V <- r-1
    kernel                    attn(Q_{r-s}, K_r, V_r)       attn(Q_r, K_{r-s}, V_{r-s})
    after                     wait; merge what came back    merge; wait
    after the last step       last partial -> r+1, merge    -
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config import RingConfig
from ..ring.head_start import block_pause_us
from ..ring.schedules import NON_CAUSAL, Step, held_back
from .machine import Machine

__all__ = [
    "Block",
    "RingOptions",
    "DEFAULTS",
    "SimResult",
    "old_final_pieces",
    "sweep_options",
    "token_ring",
    "kv_ring",
    "allgather_ring",
    "single",
]

LSE_BYTES = 4  # lse is fp32, one per (head, query)


@dataclass(frozen=True)
class RingOptions:
    """The TokenRing settings a prediction depends on; the defaults are RingConfig's."""

    defer_own: float | None = RingConfig().defer_own  # share of the own block run last
    head_start_us: float = RingConfig().comm_head_start_us  # NCCL lanes (all modelled fabrics)
    kernel: str = "cudnn"  # the calibration table's rows TokenRing's blocks are timed with


DEFAULTS = RingOptions()


@dataclass(frozen=True)
class Block:
    """One ring call's local shapes: q_len/kv_len tokens per rank, heads on this rank;
    kv_heads: K/V heads on this rank under GQA/MQA (None: as many as query heads).

    Under GQA (g = heads / kv_heads) what a K/V ring moves shrinks by g while TokenRing's Q and
    partials do not: per call TokenRing sends (n-1) x (q_bytes + partial_bytes), a K/V ring
    (n-1) x kv_bytes, so at equal lengths TokenRing moves g x (1 + 2 / (head_dim x dtype_bytes))
    times the bytes of a K/V ring (MHA: about the same; Llama-3 70B's g = 8: about 8 times)."""

    heads: int
    head_dim: int
    q_len: int
    kv_len: int
    dtype_bytes: int = 2
    dtype: str = "bfloat16"
    kv_heads: int | None = None

    @property
    def q_bytes(self) -> float:
        return self.q_len * self.heads * self.head_dim * self.dtype_bytes

    @property
    def kv_bytes(self) -> float:  # K and V together, in their own head count
        heads = self.kv_heads or self.heads
        return 2 * self.kv_len * heads * self.head_dim * self.dtype_bytes

    @property
    def partial_bytes(self) -> float:  # out + lse
        return self.q_bytes + self.q_len * self.heads * LSE_BYTES

    @property
    def merge_bytes(self) -> float:
        """fp32 log-sum-exp merge: read the block out and lse, read + write the fp32 accumulator."""
        n = self.q_len * self.heads
        return n * self.head_dim * (self.dtype_bytes + 8) + n * 3 * LSE_BYTES

    @property
    def unfused_merge_bytes(self) -> float:
        """The same merge as separate torch ops (torch's ring, yunchang's update_out_and_lse):
        block_out -> fp32, out - block_out, * sigmoid(..), out - that: ~5 fp32 tensors read and
        written (40 bytes per element) instead of one fused pass."""
        n = self.q_len * self.heads
        return n * self.head_dim * 40 + n * 6 * LSE_BYTES


@dataclass
class SimResult:
    gpu_ms: float
    host_ms: float
    breakdown: dict[str, float] = field(default_factory=dict)

    @property
    def ms(self) -> float:
        # back-to-back calls: the host runs ahead of the GPU unless it is the slower of the two
        return max(self.gpu_ms, self.host_ms)


def _kernel(
    m: Machine, b: Block, kernel: str, sent_bytes: float = 0.0, comm_ms: float = 0.0, q_len=None
) -> float:
    """One block kernel, slowed by the NCCL traffic that runs beside it.

    `sent_bytes`: what this rank sends (and, the patterns being symmetric, receives) while the
    kernel runs, in a transfer lasting `comm_ms`. The kernel loses `overlap_us_per_mb` per MB
    moved under it (ring_call_profile: the loss grows with the bytes, not with the fraction of the
    kernel the transfer covers); a transfer longer than the kernel moves only part of its bytes
    under it.
    """
    q = b.q_len if q_len is None else q_len
    k = m.table.block_ms(q, b.kv_len, b.heads, b.head_dim, b.dtype, kernel)
    if sent_bytes <= 0 or k <= 0:
        return k
    under = sent_bytes * min(1.0, k / comm_ms) if comm_ms > k else sent_bytes
    return k + m.params.overlap_us_per_mb * under / 1e9


def _flows_ms(m: Machine, src: int, flows: list[tuple[int, float]], pattern: str) -> float:
    """Duration of the flows one rank sends at once; flows on one fabric share its pattern."""
    by_fabric: dict[str, list[tuple[int, float]]] = {}
    fabrics = {}
    for dst, nbytes in flows:
        f = m.link(src, dst)
        by_fabric.setdefault(f.name, []).append((dst, nbytes))
        fabrics[f.name] = f
    out = 0.0
    for name, group in by_fabric.items():
        peers = {d for d, _ in group}
        pat = "two_peers" if len(peers) > 1 else pattern
        out = max(out, fabrics[name].pattern(pat).ms(sum(n for _, n in group)))
    return out


def _host(m: Machine, attention=0, comm=0, elementwise=0, graph=0) -> float:
    us = m.params.host_us
    return (
        attention * us["attention"]
        + comm * us["comm"]
        + elementwise * us["elementwise"]
        + graph * us["graph"]
    ) / 1e3


def single(m: Machine, b: Block, kernel: str = "cudnn") -> SimResult:
    k = _kernel(m, b, kernel)
    return SimResult(k, _host(m, attention=1), {"kernel": k})


# The held-back own block came with 378a7f6 and the head start with f399d16 (2026-11-26);
# sweeps timed before the first ran with neither (plan --validate predicts each sweep's code).
HELD_BACK_SINCE = "2026-11-26 01:07"


def sweep_options(time: str) -> RingOptions:
    """The TokenRing options the code had when a sweep of this `time` (its meta) ran: none of
    the two before HELD_BACK_SINCE, else today's defaults."""
    return DEFAULTS if time >= HELD_BACK_SINCE else RingOptions(defer_own=0.0, head_start_us=0.0)


def old_final_pieces(q_len: int) -> int:
    """Pieces of the last block in the original code (every committed sweep_*.json): one per 1024
    local queries, at most 4. The code now returns it in 1 piece (docs/performance.md)."""
    return min(4, max(1, q_len // 1024))


def token_ring(
    m: Machine,
    b: Block,
    ranks: list[int],
    graphs: bool = True,
    final_pieces: int = 1,
    options: RingOptions = DEFAULTS,
) -> SimResult:
    """TokenRing's inference loop (ring/inference/loop.py) run on the ring's own table
    (ring/schedules/token_ring.py: `steps`, `final_return`, `held_back`): K/V stay, Q moves one
    hop per step, partials go straight home one step late.

    The last block is computed in `final_pieces` pieces, each sent home while the next one runs;
    with a held-back share of the own block (`options.defer_own`) that block runs last, behind
    the last return; what the last return still has to travel is exposed, then a fused merge.
    The head start pauses the compute stream where the loop does (`options.head_start_us`).
    """
    n = len(ranks)
    if n == 1:
        return single(m, b, options.kernel)
    sim = _TokenRingSim(m, b, ranks, options, max(1, min(final_pieces, b.q_len)))
    # eager: each step's host work (2 NCCL groups, kernel, Q copy, merge) gates the next step
    step_host = 0.0 if graphs else _host(m, attention=1, comm=2, elementwise=3)
    start = [0.0] * n
    kernel_total = comm_total = 0.0
    tail = [0.0] * n  # the last step's exposed return, per rank
    for s in range(n):
        rows = [NON_CAUSAL.steps(i, n)[s] for i in range(n)]
        flows = {i: sim.flows(rows[i]) for i in range(n)}
        ends, comm_ms = sim.transfers(flows, start)
        merge = m.mem_ms(b.merge_bytes) if s >= 1 else 0.0  # step 0 initialises (out, lse)
        for i in range(n):
            sent = sum(nb for _, nb in flows[i])
            if s == n - 1:
                ends[i], tail[i], k = sim.last_step(i, start[i], ends[i], sent, comm_ms[i], merge)
            else:
                k = sim.kernel_step(rows[i], sent, comm_ms[i])
                ends[i] = max(ends[i], start[i] + k + merge)
            if i == 0:
                kernel_total += k
        comm_total += max(comm_ms)
        # the host issues step s+1 at (s+1) * step_host: it gates the GPU only when slower
        start = [max(e, (s + 1) * step_host) for e in ends]
    gpu = max(st + tl for st, tl in zip(start, tail, strict=True)) + m.mem_ms(b.merge_bytes)
    host = _host(m, graph=1, elementwise=4) if graphs else sim.eager_host()
    return SimResult(
        gpu, host, {"kernels": kernel_total, "comm": comm_total, "exposed_tail": max(tail)}
    )


@dataclass(frozen=True)
class _TokenRingSim:
    """One TokenRing call's per-rank pieces of the simulation (the table's rows, the pauses)."""

    m: Machine
    b: Block
    ranks: list[int]
    options: RingOptions
    pieces: int

    @property
    def held(self) -> int:
        """Own queries whose block runs last (the forward loop's rule, equal lengths)."""
        return held_back(self.b.q_len, self.options.defer_own)

    @property
    def pause_ms(self) -> float:
        """The head start before a block of the travelling Q against the local K/V."""
        b = self.b
        flop = 4 * b.heads * b.head_dim * b.q_len * b.kv_len
        return block_pause_us(self.options.head_start_us, flop) / 1e3

    def flows(self, row: Step) -> list[tuple[int, float]]:
        """(destination ring index, bytes) a rank sends at this row: Q on, a partial home."""
        out = [(row.q_send_to, self.b.q_bytes)] if row.q_send_to is not None else []
        if row.ret_send_to is not None:
            out.append((row.ret_send_to, self.b.partial_bytes))
        return out

    def transfers(self, flows, start: list[float]) -> tuple[list[float], list[float]]:
        """(when each rank's transfers of this step end, each sender's transfer time)."""
        ends, comm_ms = list(start), [0.0] * len(start)
        for i, out in flows.items():
            if not out:
                continue
            glob = [(self.ranks[j], nb) for j, nb in out]
            dur = _flows_ms(self.m, self.ranks[i], glob, "ring")
            for j, _ in out:
                t_end = max(start[i], start[j]) + dur
                ends[i], ends[j] = max(ends[i], t_end), max(ends[j], t_end)
                comm_ms[i] = max(comm_ms[i], dur)
        return ends, comm_ms

    def kernel_step(self, row: Step, sent: float, comm_ms: float) -> float:
        """A step before the last: its block (step 0: the own queries not held back), after
        the head start where a partial went home just before it."""
        q_len = self.b.q_len - self.held if row.step == 0 else self.b.q_len
        k = _kernel(self.m, self.b, self.options.kernel, sent, comm_ms, q_len=q_len)
        return k + (self.pause_ms if row.ret_send_to is not None else 0.0)

    def last_step(self, i: int, start: float, done: float, sent: float, comm_ms: float, merge):
        """(end, exposed return, kernel ms) of rank i's last step (`done`: when its transfers
        of this step end): the last block in pieces, each sent home (final_return) as it is
        made, then the held-back own block."""
        m, b, pieces, held = self.m, self.b, self.pieces, self.held
        home = self.ranks[NON_CAUSAL.final_return(i, len(self.ranks))[0]]
        t_piece = _flows_ms(m, self.ranks[i], [(home, b.partial_bytes / pieces)], "ring")
        kp = _kernel(m, b, self.options.kernel, q_len=b.q_len / pieces)
        # pieces 1..p-1 go home under the next piece's kernel
        over = (sent + b.partial_bytes * (pieces - 1) / pieces) * min(
            1.0, pieces * kp / max(comm_ms + (pieces - 1) * t_piece, 1e-12)
        )
        k = pieces * kp + m.params.overlap_us_per_mb * over / 1e9
        t, link_free = start, start
        for c in range(pieces):
            t += k / pieces
            link_free = max(t, link_free) + t_piece
            if c < pieces - 1 or held:  # another attention kernel follows
                t += self.pause_ms
        if held:  # the last return travels behind it
            k_tail = _kernel(m, b, self.options.kernel, b.partial_bytes / pieces, t_piece, held)
            t, k = t + k_tail, k + k_tail
        end = max(done, t + merge)
        return end, (max(0.0, link_free - end) if pieces > 1 or held else t_piece), k

    def eager_host(self) -> float:
        """Host time of an eager call: every kernel, transfer and merge op issued one by one."""
        n, pieces, extra = len(self.ranks), self.pieces, int(self.held > 0)
        pauses = (n - 2) + pieces - 1 + extra if self.pause_ms else 0
        return _host(
            self.m,
            attention=n + pieces - 1 + extra,
            comm=2 * (n - 1) + pieces - 1,
            elementwise=3 * n + pauses,
        )


def kv_ring(m: Machine, b: Block, ranks: list[int], kernel: str = "flash") -> SimResult:
    """yunchang's P2P ring: K,V move one hop per step, merged in fp32 after each kernel."""
    n = len(ranks)
    layout = m.mem_ms(2 * (b.q_bytes + b.kv_bytes + b.q_bytes))  # bhsd <-> bshd copies
    step_host = _host(m, attention=1, comm=1, elementwise=8)
    start = [layout] * n
    kernel_total = comm_total = 0.0
    for s in range(n):
        ends = list(start)
        comm_ms = [0.0] * n
        if s < n - 1:
            for i in range(n):
                j = (i + 1) % n
                dur = _flows_ms(m, ranks[i], [(ranks[j], b.kv_bytes)], "ring")
                t_end = max(start[i], start[j]) + dur
                ends[i], ends[j] = max(ends[i], t_end), max(ends[j], t_end)
                comm_ms[i] = dur
        merge = m.mem_ms(b.unfused_merge_bytes)
        sent = b.kv_bytes if s < n - 1 else 0.0
        for i in range(n):
            ends[i] = max(ends[i], start[i] + _kernel(m, b, kernel, sent, comm_ms[i]) + merge)
        kernel_total += _kernel(m, b, kernel, sent, max(comm_ms))
        comm_total += max(comm_ms)
        start = [max(e, layout + (s + 1) * step_host) for e in ends]
    gpu = max(start) + m.mem_ms(2 * b.q_bytes)
    host = n * step_host + _host(m, elementwise=5)
    return SimResult(gpu, host, {"kernels": kernel_total, "comm": comm_total})


def allgather_ring(m: Machine, b: Block, ranks: list[int]) -> SimResult:
    """torch's templated ring with all-gather rotation (xDiT 0.7 / diffusers default).

    One all-gather of K,V (NCCL ring algorithm: n-1 sub-steps, each paced by the slowest hop)
    runs under the local block; then the n-1 remote blocks run back to back with a merge each.
    """
    n = len(ranks)
    t_ag = 0.0
    for _ in range(n - 1):  # each sub-step forwards one rank's K,V around the ring
        t_ag += max(
            _flows_ms(m, ranks[i], [(ranks[(i + 1) % n], b.kv_bytes)], "ring") for i in range(n)
        )
    # NCCL's ring all-gather: every rank sends (n-1) blocks of K,V (its own, then forwarded)
    first = _kernel(m, b, "cudnn", (n - 1) * b.kv_bytes, t_ag)
    rest = (n - 1) * (_kernel(m, b, "cudnn") + m.mem_ms(b.unfused_merge_bytes))
    gather_copy = m.mem_ms(2 * n * b.kv_bytes)  # all-gather output split back into blocks
    gpu = max(first, t_ag) + gather_copy + rest + m.mem_ms(2 * b.q_bytes)
    host = _host(m, attention=n, comm=1, elementwise=8 * (n - 1) + 4)
    return SimResult(gpu, host, {"kernels": first + rest, "comm": t_ag})
