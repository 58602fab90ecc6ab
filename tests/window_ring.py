"""A windowed call through the training loops on a thread ring (tests/thread_ring.py), against
fp64 attention of the whole sequence under the same mask; counts what the loops run."""

from __future__ import annotations

import torch

from tests.thread_ring import ThreadLane, ThreadRing, _Mail, run_ring


def positions(total: int, n: int, causal: bool, split: str, bounds=None) -> list[list[int]]:
    """Each rank's global positions: zigzag chunks r and 2N-1-r (a causal row split), the
    documents layout's pieces of the documents `bounds`, else the r-th contiguous shard."""
    from tokenring_xdit.ring.packed import local_positions

    local = total // n
    if split == "documents":
        return [local_positions(tuple(bounds), r, n) for r in range(n)]
    if causal and n > 1 and split == "zigzag":
        c = local // 2
        return [[*range(r * c, (r + 1) * c), *range((2 * n - 1 - r) * c, (2 * n - r) * c)]
                for r in range(n)]  # fmt: skip
    return [list(range(r * local, (r + 1) * local)) for r in range(n)]


def window_mask(total: int, window_size, causal: bool, bounds=None) -> torch.Tensor:
    """(S, S) bool: flash-attn's window rule (causal forces right = 0), within documents."""
    left, right = window_size
    qi, ki = torch.arange(total)[:, None], torch.arange(total)[None, :]
    keep = torch.ones(total, total, dtype=torch.bool)
    if causal:
        keep &= ki <= qi
    if left >= 0:
        keep &= ki >= qi - left
    if right >= 0 and not causal:
        keep &= ki <= qi + right
    if bounds is not None:
        doc = torch.bucketize(torch.arange(total), torch.tensor(bounds[1:]), right=True)
        keep &= doc[:, None] == doc[None, :]
    return keep


def reference(q, k, v, do, window_size, causal: bool, bounds=None) -> list[torch.Tensor]:
    """[out, dq, dk, dv] of fp64 attention of the whole sequence under the window's mask (within
    documents), by autograd; (b, h, S, d) tensors on their device, GQA by repeating K/V heads."""
    ref_in = [x.detach().double().requires_grad_() for x in (q, k, v)]
    total, d = q.shape[2], q.shape[3]
    mask = window_mask(total, window_size, causal, bounds).to(q.device)
    g = q.shape[1] // k.shape[1]
    kk, vv = (x.repeat_interleave(g, dim=1) for x in ref_in[1:])
    scores = (ref_in[0] @ kk.transpose(-1, -2) * d**-0.5).masked_fill(~mask, float("-inf"))
    p = torch.softmax(scores, -1).nan_to_num(0.0)  # rows that see nothing: 0
    ref = p @ vv
    ref.backward(do.double())
    return [ref.detach(), *(x.grad for x in ref_in)]


class CountingLane(ThreadLane):
    """A thread lane that counts the posts that send something, per payload kind."""

    def __init__(self, counts: dict, *args):
        super().__init__(*args)
        self._counts = counts

    def post(self, sends, recvs, what):
        if sends:
            self._counts[what] = self._counts.get(what, 0) + 1
            self._counts["tokens_" + what] = self._counts.get("tokens_" + what, 0) + sum(
                t.shape[1]
                for t, _ in sends[:1]  # the first tensor of a bundle: (b, s, h, d)
            )
        return super().post(sends, recvs, what)


class CountingRing(ThreadRing):
    def __init__(self, mail: _Mail, rank: int, size: int, counts: dict):
        super().__init__(mail, rank, size)
        self._counts = counts

    def lanes(self):
        return (CountingLane(self._counts, self._mail, "q", self.rank),
                CountingLane(self._counts, self._mail, "ret", self.rank))  # fmt: skip


def run_counted(n: int, rank_fn) -> tuple[list, dict]:
    """run_ring with counting lanes: (results, counts summed over the ranks)."""
    mail, per_rank = _Mail(), [{} for _ in range(n)]
    results = run_ring(
        n, lambda ring: rank_fn(CountingRing(mail, ring.rank, n, per_rank[ring.rank]))
    )
    total: dict = {}
    for counts in per_rank:
        for key, value in counts.items():
            total[key] = total.get(key, 0) + value
    return results, total


def window_case(n, causal, split, local, window_size, *, bounds=None, b=1, h=2, h_kv=None, d=8,
                dtype=torch.float64, pair=None, seed=0, device="cpu",
                acc=torch.float32):  # fmt: skip
    """Forward + backward of every rank of a windowed call vs fp64 autograd of the whole
    sequence. Returns (max errors {out, dq, dk, dv} (abs / max(|ref|, 1)), counts of the run,
    the plan). `pair`: the call's own kernel record (default: the masked one); `acc`: what the
    ring sums partials and gradients in (`BlockCall.acc`; fp64: its block kernels' own error)."""
    from tokenring_xdit.ring.comm import COUNTERS
    from tokenring_xdit.ring.kernels import MASKED, gqa_pair, window_pair
    from tokenring_xdit.ring.packed import Documents
    from tokenring_xdit.ring.packed.window_plan import window_plan
    from tokenring_xdit.ring.schedules.window import Window
    from tokenring_xdit.ring.tensor_layout import BSHD
    from tokenring_xdit.ring.training.backward import block_backward
    from tokenring_xdit.ring.training.forward import BlockCall, block_forward

    total = n * local
    docs = Documents(tuple(bounds)) if bounds is not None else None
    plan = window_plan(Window.of(window_size, causal), causal, (local,) * n, split, docs)
    dev = torch.device(device)
    pair = window_pair(pair or MASKED, dev, dtype, d, d)
    if h_kv is not None:  # (as resolve_kernel: the probe decides native or expanded K/V)
        pair = gqa_pair(pair, dev, dtype, d, d)
    call = BlockCall(schedule=plan.schedule, pair=pair, layout=BSHD, scale=d**-0.5, plan=plan,
                     acc=acc)  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    heads = (h, h_kv or h, h_kv or h, h)
    q, k, v, do = (torch.randn(b, hh, total, d, generator=gen, dtype=torch.float64) for hh in heads)
    refs = reference(q, k, v, do, window_size, causal, bounds)
    pos = positions(total, n, causal, split, bounds)

    def rank_fn(ring):
        idx = torch.tensor(pos[ring.rank])
        ql, kl, vl, dol = (BSHD.from_bhsd(x.index_select(2, idx)).to(dev, dtype).contiguous()
                           for x in (q, k, v, do))  # fmt: skip
        out, lse = block_forward(call, ring, (local,) * n, ql, kl, vl)
        return [out, *block_backward(call, ring, (local,) * n, dol, ql, kl, vl, out, lse)]

    before = COUNTERS.kernel_calls
    results, counts = run_counted(n, rank_fn)
    counts["kernels"] = COUNTERS.kernel_calls - before
    order = torch.tensor([x for r in range(n) for x in pos[r]])
    errs = {}
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        got = torch.cat([BSHD.to_bhsd(res[i]).double().cpu() for res in results], dim=2)
        want = refs[i].index_select(2, order)
        errs[name] = (got - want).abs().max().item() / max(want.abs().max().item(), 1.0)
    return errs, counts, plan
