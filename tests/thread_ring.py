"""A ring of N ranks as N threads of one process: TokenRing's training loops with a queue transport.

Lets one device (one GPU, or the CPU) run the real forward/backward loops of every rank of a ring
(they use rank, size and lanes() of the ring they are given): each post puts copies of
the sent tensors in the receiver's queue for that lane, each wait copies the queued tensors
into the receive buffers (FIFO per lane, sender and receiver; the loops post in the same order
on both sides). On CUDA all threads share the device's current stream, so a copy enqueued after
its `get` runs after the kernels that produced the sent tensor.
"""

from __future__ import annotations

import queue
import threading
from collections import defaultdict

import torch

TIMEOUT_S = 60


class _Mail:
    def __init__(self):
        self._lock = threading.Lock()
        self._boxes: dict = defaultdict(queue.Queue)

    def box(self, key) -> queue.Queue:
        with self._lock:
            return self._boxes[key]


class ThreadLane:
    def __init__(self, mail: _Mail, lane: str, rank: int):
        self.step = 0
        self._mail, self._lane, self._rank = mail, lane, rank
        self._pending: list = []

    def post(self, sends, recvs, what):
        for t, peer in sends:
            self._mail.box((self._lane, self._rank, peer)).put(t.clone())
        self._pending += recvs
        return []

    def wait(self, works=None) -> None:
        for t, peer in self._pending:
            t.copy_(self._mail.box((self._lane, peer, self._rank)).get(timeout=TIMEOUT_S))
        self._pending = []


class ThreadRing:
    """What the training loops use of a ring: rank, size and lanes() (queue lanes)."""

    def __init__(self, mail: _Mail, rank: int, size: int):
        self.rank, self.size, self._mail = rank, size, mail

    def lanes(self):
        return ThreadLane(self._mail, "q", self.rank), ThreadLane(self._mail, "ret", self.rank)


def run_ring(n: int, rank_fn) -> list:
    """rank_fn(ring) on N threads, one ThreadRing each; returns their results in rank order."""
    mail = _Mail()
    results: list = [None] * n
    errors: list = []

    def body(rank):
        try:
            results[rank] = rank_fn(ThreadRing(mail, rank, n))
        except BaseException as exc:  # re-raised in the caller
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def ring_case(
    n, causal, lens, b, h, d, dtype, device, pair, layout, seed=0, hold_back=False, h_kv=None,
    acc=torch.float32,
):  # fmt: skip
    """Forward + backward of every rank through the loops vs fp64 autograd of the whole sequence.

    lens: causal: each rank's half length (zigzag: rank r holds chunks r and 2N-1-r of a
    sequence cut at those lengths); non-causal: each rank's local length (contiguous shards).
    Returns the max errors: out (abs), dq/dk/dv (abs / max |ref|). hold_back: the own block
    held back in part (ring/training/hold_back.py); h_kv: K/V heads (GQA; default h); acc: what
    the ring sums in (`BlockCall.acc`; fp64: its block kernels' own error).
    """
    from tokenring_xdit.ring.training.backward import block_backward
    from tokenring_xdit.ring.training.forward import BlockCall, block_forward
    from tokenring_xdit.ring.schedules import CAUSAL_ZIGZAG, NON_CAUSAL_BLOCKS

    gen = torch.Generator(device="cpu").manual_seed(seed)
    if causal:
        chunk_lens = list(lens) + list(reversed(lens))  # chunk j has len of rank min(j, 2N-1-j)
        pos_of = []
        starts = [sum(chunk_lens[:j]) for j in range(2 * n)]
        for r in range(n):
            pos_of.append(
                list(range(starts[r], starts[r] + lens[r]))
                + list(range(starts[2 * n - 1 - r], starts[2 * n - 1 - r] + lens[r]))
            )
        total = sum(chunk_lens)
    else:
        starts = [sum(lens[:r]) for r in range(n)]
        pos_of = [list(range(starts[r], starts[r] + lens[r])) for r in range(n)]
        total = sum(lens)
    heads = (h, h_kv or h, h_kv or h, h)
    q, k, v, do = (torch.randn(b, hh, total, d, generator=gen, dtype=torch.float64) for hh in heads)
    q, k, v, do = (x.to(dtype).to(device) for x in (q, k, v, do))
    ref_in = [x.double().requires_grad_() for x in (q, k, v)]
    ref = torch.nn.functional.scaled_dot_product_attention(
        *ref_in, is_causal=causal, enable_gqa=h_kv is not None
    )
    ref.backward(do.double())
    refs = [ref.detach(), *(x.grad for x in ref_in)]

    def local(x, r):  # (b, h, S, d) -> this rank's shard in `layout`
        idx = torch.tensor(pos_of[r], device=device)
        return layout.from_bhsd(x.index_select(2, idx)).contiguous()

    schedule = CAUSAL_ZIGZAG if causal else NON_CAUSAL_BLOCKS
    call = BlockCall(schedule=schedule, pair=pair, layout=layout, scale=d**-0.5,
                     hold_back=hold_back, acc=acc)  # fmt: skip
    q_lens = tuple(2 * x for x in lens) if causal else tuple(lens)

    def rank_fn(ring):
        ql, kl, vl, dol = (local(x, ring.rank) for x in (q, k, v, do))
        out, lse = block_forward(call, ring, q_lens, ql, kl, vl)
        grads = block_backward(call, ring, q_lens, dol, ql, kl, vl, out, lse)
        return [out, *grads]

    results = run_ring(n, rank_fn)
    errs = {}
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        got = torch.cat([layout.to_bhsd(res[i]).double() for res in results], dim=2)
        order = torch.tensor([p for r in range(n) for p in pos_of[r]], device=device)
        want = refs[i].index_select(2, order)
        err = (got - want).abs().max().item()
        errs[name] = err if name == "out" else err / max(want.abs().max().item(), 1.0)
    return errs
