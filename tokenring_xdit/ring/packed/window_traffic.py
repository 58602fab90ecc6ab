"""What a windowed call's plan runs, step by step: the prediction behind a windowed call's cost.

Pure (no torch): from the same plan the loops run (window_plan.py), per step of the schedule, how
many ranks run a kernel, and the most query rows any rank sends on the Q lane and on the return
lane (the step's transfers run side by side on every rank, so the step waits for the longest).
Bytes follow from a token's size on each lane: Q = heads x head size x the dtype's bytes in the
forward (Q, dO, lse, delta in the backward); a partial = (out, fp32 lse) in the forward, dQ in the
backward.
"""

from __future__ import annotations

from typing import NamedTuple

from ..schedules.blocks import part_len
from ..schedules.window import Window
from .window_plan import WindowPlan, window_plan

__all__ = ["StepTraffic", "plan_traffic", "window_traffic"]


class StepTraffic(NamedTuple):
    """One step of a pass: ranks that run a kernel, Q / return posts that send (summed over
    ranks), and the most query rows one rank sends on each lane (the step's critical transfer)."""

    step: int
    kernels: int
    q_posts: int
    ret_posts: int
    q_rows: int
    ret_rows: int


def plan_traffic(plan: WindowPlan, q_lens: tuple[int, ...]) -> tuple[StepTraffic, ...]:
    """Per step of `plan` (its return-only row included): what the block loop runs."""
    n, rows = plan.size, []
    for t in range(len(plan.steps[0])):
        kernels = q_posts = ret_posts = q_rows = ret_rows = 0
        for r in range(n):
            st = plan.steps[r][t]
            kernels += st.kernel and plan.block(r, t) != ()
            if st.q_send_to is not None and plan.transfers(r)[t][0]:
                q_posts += 1
                q_rows = max(q_rows, part_len(st.q_send_part, q_lens[st.q_owner]))
            if st.ret_send_to is not None and plan.attends(r, t - 1):
                ret_posts += 1
                ret_rows = max(ret_rows, part_len(st.ret_send_part, q_lens[st.ret_send_to]))
        rows.append(StepTraffic(t, kernels, q_posts, ret_posts, q_rows, ret_rows))
    return tuple(rows)


def window_traffic(
    n: int, local: int, window_size: tuple[int, int], causal: bool, split: str = "zigzag",
    q_token_bytes: int = 1, ret_token_bytes: int = 1,
) -> dict:  # fmt: skip
    """For a ring of `n` equal shards of `local` tokens cut in `split` (ring/packed's layout
    names): the steps that run anything, and per step the kernels and the critical bytes on
    each lane (`*_token_bytes`: one query row's size on that lane). A window that hides nothing
    runs the call's whole table (every step)."""
    window = Window.of(window_size, causal) or Window(-1, -1 if not causal else 0)
    plan = window_plan(window, causal, (local,) * n, split)
    steps = [s for s in plan_traffic(plan, (local,) * n) if s.kernels or s.q_posts or s.ret_posts]
    return {
        "steps_run": sum(1 for s in steps if s.kernels),
        "kernels": sum(s.kernels for s in steps),
        "per_step": [
            {"step": s.step, "kernels": s.kernels, "q_bytes": s.q_rows * q_token_bytes,
             "ret_bytes": s.ret_rows * ret_token_bytes}
            for s in steps
        ],
    }  # fmt: skip
