"""GPU checks of the IPC transport with several ranks on ONE GPU (marker `gpu`):

python -m pytest -m gpu tests/gpu/test_gpu_ipc.py -q

Ranks are processes with a gloo world group (CPU), all on cuda:0; data moves by CUDA IPC.
- the lane contract: rounds of sends/receives on both lanes (ring pattern on the Q lane, changing
  peers on the return lane, growing sizes, ranks skewed on host and GPU) deliver every byte;
- a peer that raises or dies mid-exchange gives TokenRingCommError on every live rank within the
  group's timeout, and the live ranks' GPUs are not left blocked.
"""

from __future__ import annotations

import os
import time

import pytest
import torch

from tests.harness import run_ranks, values
from tokenring_xdit.tools.launch import launch_outcomes

pytestmark = pytest.mark.gpu

GROUP_TIMEOUT_S = 6


def _payload(src: int, dst: int, step: int, length: int, dtype) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(src * 1_000_003 + dst * 1009 + step)
    return torch.randn(length, device="cuda", generator=gen).to(dtype)


def _exchange(rank, n, q_lane, r_lane, step, length):
    """One step: Q lane to rank+1 (two tensors), return lane to rank+off (one tensor)."""
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    off = step % (n - 1) + 1
    to, frm = (rank + off) % n, (rank - off) % n
    dtypes = (torch.float32, torch.bfloat16)
    sent = [_payload(rank, nxt, step, length + i, dt) for i, dt in enumerate(dtypes)]
    got = [torch.empty(length + i, device="cuda", dtype=dt) for i, dt in enumerate(dtypes)]
    ret_len = length // 2 + 3
    ret_sent = _payload(rank, to, step, ret_len, torch.float32)
    ret_got = torch.empty(ret_len, device="cuda")
    if (rank + step) % 3 == 0:
        torch.cuda._sleep(2_000_000)  # skew this rank's GPU: the peers' copies must wait
    q_lane.post([(t, nxt) for t in sent], [(t, prv) for t in got], "q")
    r_lane.post([(ret_sent, to)], [(ret_got, frm)], "partial")
    time.sleep(0.002 * ((rank + step) % 3))  # and its host
    q_lane.wait()
    r_lane.wait()
    want = [_payload(prv, rank, step, length + i, dt) for i, dt in enumerate(dtypes)]
    want.append(_payload(frm, rank, step, ret_len, torch.float32))
    return all(torch.equal(a, b) for a, b in zip([*got, ret_got], want, strict=True))


def _lanes_worker(rank, n):
    import torch.distributed as dist

    from tokenring_xdit.ring.comm import COUNTERS, comms_of
    from tokenring_xdit.ring.comm.ipc.lanes import ipc_lanes

    torch.cuda.set_device(0)
    comms = comms_of(dist.group.WORLD)
    COUNTERS.reset()
    ok = []
    for call, base in enumerate((1000, 1000, 300_000)):  # reuse, then grow the inboxes
        q_lane, r_lane = ipc_lanes(comms, rank)
        for step in range(6):
            q_lane.step = r_lane.step = step
            ok.append(_exchange(rank, n, q_lane, r_lane, step, base + 4097 * step * call))
    torch.cuda.synchronize()
    return ok, COUNTERS.q_messages, COUNTERS.partial_messages


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ipc_lanes_deliver_every_byte_on_one_gpu(n):
    for rank, (ok, q_msgs, partial_msgs) in enumerate(
        values(run_ranks(_lanes_worker, n, timeout=240))
    ):
        assert all(ok), (rank, ok)
        assert (q_msgs, partial_msgs) == (2 * 18, 18), (rank, q_msgs, partial_msgs)


def _fault_worker(rank, n, report, mode):
    import datetime

    import torch.distributed as dist

    from tokenring_xdit.ring.comm import comms_of
    from tokenring_xdit.ring.comm.ipc.lanes import ipc_lanes

    torch.cuda.set_device(0)
    timeout = datetime.timedelta(seconds=GROUP_TIMEOUT_S)
    dist.distributed_c10d._set_pg_timeout(timeout, dist.group.WORLD)
    q_lane, r_lane = ipc_lanes(comms_of(dist.group.WORLD), rank)
    start = time.monotonic()
    try:
        for step in range(4):
            q_lane.step = r_lane.step = step
            if rank == n - 1 and step == 2:
                if mode == "dies":
                    os._exit(17)
                raise RuntimeError("injected failure")
            _exchange(rank, n, q_lane, r_lane, step, 4096)
    except RuntimeError as exc:
        if rank == n - 1:  # the failing rank stays alive past everyone's timeout
            time.sleep(GROUP_TIMEOUT_S + 4)
            return ("injected", str(exc), 0.0, 0.0)
        elapsed = time.monotonic() - start
        t0 = time.monotonic()
        torch.cuda.synchronize()  # our streams were released: this must not hang
        return (type(exc).__name__, str(exc), elapsed, time.monotonic() - t0)
    return ("no error", "", time.monotonic() - start, 0.0)


@pytest.mark.parametrize("mode", ["dies", "raises_and_stays"])
@pytest.mark.parametrize("n", [2, 3])
def test_ipc_peer_failure_is_named_within_the_timeout(n, mode):
    outcomes = launch_outcomes(
        _fault_worker, n, (mode,), timeout=GROUP_TIMEOUT_S + 60, env={"OMP_NUM_THREADS": "1"}
    )
    failing = outcomes[-1]
    if mode == "dies":
        assert not failing.ok and failing.failure.error_type == "ProcessDied", failing
    else:
        assert failing.ok and failing.value[0] == "injected", failing
    for o in outcomes[:-1]:
        assert o.ok, f"rank {o.rank}: {o.failure}"
        kind, message, elapsed, sync_s = o.value
        assert kind == "TokenRingCommError", (o.rank, kind, message)
        # the ranks that receive from the failed one stop at step 2, others one step later
        assert "global rank" in message and "lane (ipc" in message, message
        assert "at step 2" in message or "at step 3" in message, message
        assert elapsed < GROUP_TIMEOUT_S + 5, (o.rank, elapsed, message)
        assert sync_s < 5, (o.rank, sync_s)
