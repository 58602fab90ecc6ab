"""An order to pack documents in, so the row's zigzag (or contiguous shards) balances the ranks.

Attention never crosses a document, so the order of the documents in a packed row changes no
result, only where each document lands in the row's zigzag split and so each rank's work. The
documents layout (doc_split.py) balances the pairs but multiplies short pieces; a better
packing order keeps the zigzag's few segments and skipped blocks and still evens the ranks
(the committed H200 row of 7 documents at ring 4, with flash_varlen: the slowest rank
predicted 8.67 ms as packed, 7.40 ms in the order found here, the best of all 5040 orders 7.16;
with cuDNN per segment, which `auto` runs there, 5.45 -> 5.32 ms, and 16.59 -> 14.34 for the
128k row of 28 documents; measured with flash_varlen: 12.76 -> 11.69 and 34.23 -> 33.59 ms).

`balanced_order` searches swaps of two documents, keeping a swap when the cost model's
(layout_cost.py) slowest rank gets faster; it starts from the given order, so the answer is
never predicted slower, and its random swaps come from a fixed seed, so equal lengths give an
equal order on every rank and in every run. Use it where rows are packed (a data collator),
then pass the packed row's cu_seqlens as usual: nothing in the ring changes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from itertools import accumulate

from ..kernels.names import KernelName
from ..schedules import block_schedule
from .cost import LayoutCost, load, plan_work
from .doc_split import CONTIGUOUS, ROW, normal_split
from .documents import Documents, doc_plan

__all__ = ["balanced_order", "row_ms"]


# The packed kernel whose constants the search uses by default: what `auto` runs a zigzag row
# with on CUDA in half precision (cuDNN per segment, measured faster there, 4 x H200).
KERNEL = KernelName.CUDNN.value


def row_ms(
    lengths: Sequence[int],
    world_size: int,
    causal: bool = True,
    cost=None,
    kernel: str = KERNEL,
    split: str = ROW,
) -> float:
    """The cost model's ms of the slowest rank when documents of `lengths`, packed in this
    order, are cut by `split` (the row's split, or "contiguous" shards of a causal row) over
    `world_size` ranks (`cost`, else `kernel`'s constants)."""
    cost = cost or load(kernel=kernel)
    split = _checked_split(split, causal, world_size)
    return _row_ms(tuple(lengths), world_size, causal, cost, split)


def _checked_split(split: str, causal: bool, world_size: int) -> str:
    if split not in (ROW, CONTIGUOUS):
        raise ValueError(f"split must be {ROW!r} or {CONTIGUOUS!r}, got {split!r}")
    return normal_split(split, causal, world_size)


def _row_ms(
    lengths: tuple[int, ...], n: int, causal: bool, cost: LayoutCost, split: str = ROW
) -> float:
    docs = Documents(tuple(accumulate((x for x in lengths if x), initial=0)))
    q_lens = (docs.total // n,) * n
    # not doc_plan's cache: the search makes hundreds of plans no call will ask for
    plan = doc_plan.__wrapped__(docs, block_schedule(causal, split), q_lens, split)
    return max(cost.ms(plan_work(plan, q_lens, r, cost.tile)) for r in range(n))


def balanced_order(
    lengths: Sequence[int],
    world_size: int,
    causal: bool = True,
    *,
    tries: int = 256,
    seed: int = 0,
    cost: LayoutCost | None = None,
    kernel: str = KERNEL,
    split: str = ROW,
) -> list[int]:
    """Indices into `lengths`: the order to pack the documents in (a permutation; the given
    order where no swap helps), judged by `cost`, else by the constants of the packed `kernel`
    the ring will run ("cudnn" per segment; "flash_varlen", `auto`'s choice on a new packing of
    many documents), for rows cut by `split` (the row's zigzag, or "contiguous" shards).
    ValueError if the row cannot be split (its total must divide by 2 x world_size for the
    causal zigzag, by world_size otherwise: pad with one more document first)."""
    lengths = [int(x) for x in lengths]
    n, total = world_size, sum(lengths)
    split = _checked_split(split, causal, n)
    if n < 1 or min(lengths, default=0) < 0:
        raise ValueError("world_size must be >= 1 and document lengths >= 0")
    if total % (2 * n if causal and split == ROW else n):
        raise ValueError(
            f"{total} tokens do not split evenly over {n} ranks; pad the row with one more "
            "document first (labels -100)"
        )
    order = list(range(len(lengths)))
    if n == 1 or len(order) < 2:
        return order
    cost, rng = cost or load(kernel=kernel), random.Random(seed)

    def ms(o):
        return _row_ms(tuple(lengths[i] for i in o), n, causal, cost, split)

    best = ms(order)
    for _ in range(tries):
        i, j = rng.sample(range(len(order)), 2)
        order[i], order[j] = order[j], order[i]
        now = ms(order)
        if now < best:
            best = now
        else:
            order[i], order[j] = order[j], order[i]
    return order
