"""TokenRing forward: K/V stay, Q moves forward, partials go straight home.

The schedule (who sends what to whom at step s) is drawn in `schedule.py`; this file is the loop
that runs it. Per step both transfers are posted before the kernel and waited after it.
"""

from __future__ import annotations

import os
from collections.abc import Hashable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import fused_merge
from .checks import check_inputs
from .comm import COUNTERS, Lane, out_group_for
from .graphs import graphs_wanted, run_graphed
from .kernels import BlockKernel, run_block, select_kernel
from .layout import Layout, get_layout
from .merge import PartialMerge
from .schedule import chunk_bounds, final_return, steps

__all__ = ["token_ring_attn", "default_final_chunks", "FINAL_CHUNKS_ENV"]


FINAL_CHUNKS_ENV = "TOKENRING_XDIT_FINAL_CHUNKS"


def default_final_chunks() -> int:
    """Pieces of the last partial's return when the call names none: $TOKENRING_XDIT_FINAL_CHUNKS,
    else 1: one piece was the fastest, or within 0.1 %, at 11 of 12 shapes measured on H200
    (benchmarks/final_chunks.py, docs/performance.md). -1 when the
    variable is not a positive integer: the input check then rejects it on every rank."""
    raw = os.environ.get(FINAL_CHUNKS_ENV)
    if raw is None:
        return 1
    try:
        value = int(raw)
    except ValueError:
        return -1
    return value if value >= 1 else -1


def token_ring_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    layout: str | Layout = "bshd",
    softmax_scale: float | None = None,
    causal: bool = False,
    kernel: str | BlockKernel = "auto",
    final_chunks: int | None = None,
    joint_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    joint_strategy: str = "rear",
    cuda_graph: bool | None = None,
    kernel_key: Hashable | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention of the local queries against the K/V of every rank of `group`.

    q: (b, s_q, h, d) or (b, h, s_q, d) per `layout`; k, v: the local K/V in the same layout,
    whose length may differ from s_q (a KV cache) and from other ranks' lengths. Returns
    out (layout and dtype of q) and lse (b, h, s_q) fp32. `kernel` is a name from
    `kernels.KERNELS`, "auto", or a callable (q, k, v, scale, layout) -> (out, lse fp32).
    `joint_kv` is extra K/V (xDiT's joint text tokens) that this rank's own queries attend
    exactly once, joined before ("front") or after ("rear") the local K/V in the step-0 block.
    On CUDA the ring runs as a CUDA graph per input signature (`cuda_graph`, default from
    TOKENRING_XDIT_CUDA_GRAPHS, on); a callable `kernel` is graphed only with a `kernel_key` that
    names it stably across calls.
    """
    layout = get_layout(layout)
    group, rank, world_size = _ring_position(group)
    if joint_strategy not in ("front", "rear"):
        raise ValueError(f"joint_strategy must be 'front' or 'rear', got {joint_strategy!r}")
    # resolved before the handshake, so ranks that disagree (or a bad setting) fail together
    chunks = final_chunks if final_chunks is not None else default_final_chunks()
    shapes = check_inputs(q, k, v, layout, causal, chunks, group, rank, world_size, joint_kv)
    scale = softmax_scale if softmax_scale is not None else q.shape[3] ** -0.5
    if not callable(kernel):
        kernel_key, (_, kernel) = (
            kernel,
            select_kernel(kernel, q.device, q.dtype, q.shape[3], v.shape[3]),
        )
    if world_size == 1:  # nothing to exchange, and no self-sends
        COUNTERS.kernel_calls += 1
        out, lse = run_block(
            kernel, q, *_join(k, v, joint_kv, joint_strategy, layout), scale, layout
        )
        return out.to(q.dtype), lse.float()
    chunks = min(chunks, min(shapes.q_lens))  # equal piece count on every rank
    inputs = (q, k, v) + (tuple(joint_kv) if joint_kv is not None else ())

    def run(xs):
        own_kv = _join(xs[1], xs[2], xs[3:] or None, joint_strategy, layout)
        return _ring_forward(
            *xs[:3], own_kv, scale, kernel, layout, group, rank, shapes.q_lens, chunks
        )

    if kernel_key is None or not graphs_wanted(cuda_graph, q.device):
        return run(inputs)
    key = (
        group,
        rank,
        kernel_key,
        layout.name,
        scale,
        chunks,
        joint_strategy,
        fused_merge.enabled(),  # a graph bakes in the merge it was captured with
        tuple((x.shape, x.stride(), x.dtype) for x in inputs),
    )
    return run_graphed(key, inputs, run, group)


def _join(k, v, joint_kv, strategy: str, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """K/V for the step-0 block: the local K/V plus the joint K/V, which only our own queries
    meet (each query's owner runs step 0 on it once, so every query sees the joint K/V once)."""
    if joint_kv is None:
        return k, v
    parts = [(k, v), joint_kv] if strategy == "rear" else [joint_kv, (k, v)]
    return tuple(torch.cat([p[i] for p in parts], dim=layout.seq_dim) for i in (0, 1))


def _ring_position(group: dist.ProcessGroup | None) -> tuple[dist.ProcessGroup | None, int, int]:
    if not dist.is_initialized():
        if group is not None:
            raise ValueError(
                "TokenRing: a group was given but torch.distributed is not initialized"
            )
        return None, 0, 1
    group = group if group is not None else dist.group.WORLD
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(
            f"TokenRing: global rank {dist.get_rank()} is not a member of the given group "
            f"(ranks {dist.get_process_group_ranks(group)}); pass this rank's own ring group"
        )
    return group, rank, dist.get_world_size(group)


def _run_kernel(kernel: BlockKernel, q, k, v, scale, layout) -> tuple[torch.Tensor, torch.Tensor]:
    COUNTERS.kernel_calls += 1
    out, lse = run_block(kernel, q, k, v, scale, layout)
    return out.contiguous(), lse.float().contiguous()  # P2P needs dense buffers


@dataclass
class _Ring:
    """What one ring forward fixes before its first step."""

    kernel: BlockKernel
    scale: float
    layout: Layout
    rank: int
    q_lens: tuple[int, ...]  # every ring rank's local query length
    chunks: int  # pieces of the last block
    q_lane: Lane  # the ring group: Q, and the last partial's pieces
    out_lane: Lane  # the return communicator: the other partials

    @property
    def size(self) -> int:
        return len(self.q_lens)

    def block(self, q, k, v) -> tuple[torch.Tensor, torch.Tensor]:
        return _run_kernel(self.kernel, q, k, v, self.scale, self.layout)


def _ring_forward(q, k, v, own_kv, scale, kernel, layout, group, rank, q_lens, chunks):
    ring = _Ring(
        kernel, scale, layout, rank, tuple(q_lens), chunks, Lane(group), Lane(out_group_for(group))
    )
    n = ring.size
    b, _, h, d = layout.dims(q)
    held_q = q.contiguous()
    # One receive buffer pair for our own partials, reused: each merge is ordered before the
    # next receive is posted (same stream on CUDA, synchronous on gloo).
    ret = (
        layout.empty(b, q_lens[rank], h, v.shape[3], like=q),
        torch.empty(b, h, q_lens[rank], dtype=torch.float32, device=q.device),
    )
    merge = prev = None
    for st in steps(rank, n):
        next_q = None
        if st.q_send_to is not None:
            next_q = layout.empty(b, q_lens[st.q_recv_owner], h, d, like=q)
            ring.q_lane.post([(held_q, st.q_send_to)], [(next_q, st.q_recv_from)], "q")
        if st.ret_send_to is not None:
            ring.out_lane.post(
                [(prev[0], st.ret_send_to), (prev[1], st.ret_send_to)],
                [(ret[0], st.ret_recv_from), (ret[1], st.ret_recv_from)],
                "partial",
            )
        if st.step == n - 1:
            pending = ret if st.ret_send_to is not None else None
            return _last_step(ring, held_q, k, v, merge, pending, q.dtype)
        block = ring.block(held_q, *(own_kv if st.step == 0 else (k, v)))
        ring.q_lane.wait()
        ring.out_lane.wait()
        if merge is None:
            # step 0: our own Q against our own K/V; n-1 partials of it are still to come
            merge = PartialMerge(*block, layout, q.dtype, updates=n - 1)
        elif st.ret_send_to is not None:
            merge.update(*ret)
        prev = block if st.step > 0 else None
        held_q = next_q
    raise AssertionError("unreachable: the last step returns")


def _last_step(ring: _Ring, held_q, k, v, merge: PartialMerge, pending, dtype):
    """Compute the last partial in pieces and send each home as soon as it exists.

    It goes to rank+1, the way Q went, so it uses the Q lane, idle now; the out lane still
    carries the previous step's return (`pending`), merged while the pieces are in flight.
    """
    layout, n, rank = ring.layout, ring.size, ring.rank
    send_to, recv_from = final_return(rank, n)
    sent_bounds = chunk_bounds(ring.q_lens[send_to], ring.chunks)  # send_to owns held_q
    recv_bounds = chunk_bounds(ring.q_lens[rank], ring.chunks)
    b, _, h, _ = layout.dims(held_q)
    pieces = []
    for (s0, s1), (r0, r1) in zip(sent_bounds, recv_bounds, strict=True):
        out_c, lse_c = ring.block(layout.seq_slice(held_q, slice(s0, s1)), k, v)
        recv_out = layout.empty(b, r1 - r0, h, v.shape[3], like=held_q)
        recv_lse = torch.empty(b, h, r1 - r0, dtype=torch.float32, device=held_q.device)
        works = ring.q_lane.post(
            [(out_c, send_to), (lse_c, send_to)],
            [(recv_out, recv_from), (recv_lse, recv_from)],
            "partial",
        )
        # keep the sent piece referenced until its transfer is waited for
        pieces.append((works, slice(r0, r1), recv_out, recv_lse, out_c, lse_c))
    ring.out_lane.wait()
    if pending is not None:
        merge.update(*pending)
    for works, seq, recv_out, recv_lse, *_sent in pieces:  # merge piece c while c+1.. travel
        ring.q_lane.wait(works)
        merge.update(recv_out, recv_lse, seq, last=True)
    return merge.result(dtype)
