"""One rank of a peer-fault scenario; tests/peer_faults/scenarios.py starts two.

Both ranks loop TokenRing calls on one path (`--path`); rank `--faulty` (1) injects `--fault`
at call `--fault-at`, the other ("survivor") keeps calling. Every event worth timing is one
JSON line in `<--events>/rank<R>.jsonl` (and on stdout): ready, fault, error, finished,
exiting, atexit. The survivor exits with 3 after catching TokenRingCommError (the program's
chosen code), 0 if it finished, 1 after any other exception.

Faults of the faulty rank:
- die: `os._exit(1)` right after call N returns (on NCCL its last transfers are still queued);
- die_mid: `os._exit(1)` inside call N, at its first ring transfer after step 0;
- hang: stops calling after call N (sleeps forever, the process stays);
- hang_mid: sleeps forever inside call N, at its first ring transfer after step 0;
- raise_exit: a RuntimeError in its own Python after call N; the process exits with it (1);
- raise_stay: the same error, then it sits in its exception handler (sleeps forever).
The *_mid faults wrap the lanes' `post` in the faulty process only (a replayed CUDA graph posts
nothing from Python: there they fall back to the fault after the call, and the event says so).
"""

from __future__ import annotations

import argparse
import atexit
import faulthandler
import json
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

PATHS = ("train", "infer_graphed", "infer_eager", "compiled", "ipc", "packed")
FAULTS = ("die", "die_mid", "hang", "hang_mid", "raise_exit", "raise_stay")
EXIT_NAMED, EXIT_OTHER = 3, 1  # the survivor's exit codes (the "program's code")
FOREVER_S = 10**6


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--path", choices=PATHS, default="train")
    p.add_argument("--fault", choices=FAULTS, default="die")
    p.add_argument("--fault-at", type=int, default=30, help="call index of the fault")
    p.add_argument("--faulty", type=int, default=1, help="the rank that faults")
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--tokens", type=int, default=16384, help="whole sequence")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--deadline", type=float, default=8.0, help="TOKENRING_XDIT_TIMEOUT")
    p.add_argument("--deadline-from", choices=("env", "group"), default="env",
                   help="group: leave TOKENRING_XDIT_TIMEOUT unset and give the deadline to "
                        "init_process_group(timeout=...) instead")  # fmt: skip
    p.add_argument("--warmup-deadline", type=float, default=None,
                   help="deadline of the calls before --fault-at (slow first calls on busy "
                        "CPUs; the ring's communicators are made with it)")  # fmt: skip
    p.add_argument("--compile-backend", default="inductor")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--then", choices=("exit", "continue"), default="exit",
                   help="the survivor after its error: exit 3, or first work on a group of "
                        "its own (a ring of one and an all_reduce), then exit 3")  # fmt: skip
    p.add_argument("--events", type=Path, required=True, help="folder of the event files")
    return p.parse_args(argv)


class Events:
    """Timestamped JSON lines of one rank, flushed at once (the process may die next)."""

    def __init__(self, folder: Path, rank: int):
        folder.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self.file = open(folder / f"rank{rank}.jsonl", "a", buffering=1)  # noqa: SIM115

    def say(self, event: str, **what) -> None:
        line = json.dumps(dict(what, event=event, rank=self.rank, t=time.time()))
        self.file.write(line + "\n")
        self.file.flush()
        print("EVENT " + line, flush=True)


def _fault_inside(events: Events, fault: str, state: dict) -> None:
    """Wrap the lanes' post: at the armed call, past step 0, die or hang there."""
    from tokenring_xdit.ring.comm.ipc.lanes import IpcLane
    from tokenring_xdit.ring.comm.lanes import TorchLane

    def wrap(cls) -> None:
        post = cls.post

        def faulting_post(self, sends, recvs, what):
            if state["armed"] and self.step >= 1:
                events.say("fault", fault=fault, call=state["call"], where=f"step {self.step}")
                if fault == "die_mid":
                    os._exit(1)
                time.sleep(FOREVER_S)
            return post(self, sends, recvs, what)

        cls.post = faulting_post

    wrap(TorchLane)
    wrap(IpcLane)


def _inputs(args, torch, tr, device, train: bool):
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    kv_heads = max(args.heads // 4, 1)
    x = torch.randn(1, args.tokens, args.heads, args.head_dim, device=device, dtype=dtype)
    kv = torch.randn(1, args.tokens, kv_heads, args.head_dim, device=device, dtype=dtype)
    # training: causal zigzag shards; inference: non-causal (contiguous) shards, the calls a
    # ring captures as CUDA graphs (a causal inference call is never graphed)
    q, k, v = (tr.shard(t, None, causal=train).requires_grad_(train) for t in (x, kv, kv))
    return q, k, v


def _step_fn(args, torch, tr):
    """One call of the path: a function () -> output tensor, given the shards."""
    if args.path in ("train", "packed", "compiled"):
        kw = {"cu_seqlens": [0, args.tokens // 3, args.tokens // 2, args.tokens]}
        kw = kw if args.path == "packed" else {}
        # the zigzag split _inputs cut the shards by
        kw["split"] = tr.make_split(args.tokens, torch.distributed.get_world_size(), causal=True)

        def ring(q, k, v):
            return tr.token_ring_attn_func(q, k, v, causal=True, **kw) * 2.0

        attn = ring
        if args.path == "compiled":

            class Attention(torch.nn.Module):
                def forward(self, q, k, v):
                    return ring(q, k, v)

            attn = torch.compile(Attention(), backend=args.compile_backend)

        def train_step(q, k, v):
            out = attn(q, k, v)
            out.float().square().mean().backward()
            return out

        return train_step, True

    def infer_step(q, k, v):
        with torch.no_grad():
            return tr.token_ring_attn(q, k, v)[0]

    return infer_step, False


def main(argv: list[str] | None = None) -> None:
    args = _args(argv)
    from_env = args.deadline_from == "env"
    os.environ.pop("TOKENRING_XDIT_TIMEOUT", None)
    if from_env:
        os.environ["TOKENRING_XDIT_TIMEOUT"] = str(args.warmup_deadline or args.deadline)
    os.environ["TOKENRING_XDIT_CUDA_GRAPHS"] = "0" if args.path == "infer_eager" else "1"
    if args.path == "ipc":
        os.environ["TOKENRING_XDIT_TRANSPORT"] = "ipc"
    import torch
    import torch.distributed as dist

    cuda = args.device == "cuda"
    t0 = time.time()
    # the harness asks a rank still running at its wall for its stacks (launch.py)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    timeout = None if from_env else timedelta(seconds=args.deadline)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timeout)
    rank = dist.get_rank()
    device = torch.device("cpu")
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    events = Events(args.events, rank)
    events.say("started", t0=t0)
    atexit.register(lambda: events.say("atexit"))  # first registered: runs last
    import tokenring_xdit as tr
    from tokenring_xdit.ring.comm import TokenRingCommError

    torch.manual_seed(0)
    step, train = _step_fn(args, torch, tr)
    q, k, v = _inputs(args, torch, tr, device, train)
    faulty = rank == args.faulty
    state = {"armed": False, "call": -1}
    if faulty and args.fault.endswith("_mid"):
        _fault_inside(events, args.fault, state)
    code, i = 0, -1
    dist.barrier()  # every rank starts its first call (and makes the ring) together
    try:
        for i in range(args.calls):
            if i == args.fault_at:  # past the warm-up: every rank here, the real deadline on
                if device.type == "cuda":
                    torch.cuda.synchronize()
                dist.barrier()
                if from_env:
                    os.environ["TOKENRING_XDIT_TIMEOUT"] = str(args.deadline)
                events.say("ready", call=i)
            state.update(armed=faulty and i == args.fault_at, call=i)
            out = step(q, k, v)
            if faulty and i == args.fault_at:
                _fault_after(events, args.fault, i)
            if i % 10 == 9:
                out.float().mean().item()  # where a training loop blocks on the GPU
        events.say("finished", call=i)
    except TokenRingCommError as exc:
        events.say("error", type=type(exc).__name__, message=str(exc)[:1500], call=i,
                   thread=threading.current_thread().name)  # fmt: skip
        code = EXIT_NAMED
        if args.then == "continue":
            _continue(events, torch, dist, tr, device, (q, k, v))
    except Exception as exc:
        events.say("error", type=type(exc).__name__, message=str(exc)[:1500], call=i,
                   thread=threading.current_thread().name)  # fmt: skip
        if faulty and args.fault == "raise_stay":
            time.sleep(FOREVER_S)  # sits in its exception handler
        events.say("exiting", code=EXIT_OTHER)
        raise
    _exit_prep(events, torch, dist)
    events.say("exiting", code=code)
    sys.exit(code)


def _exit_prep(events: Events, torch, dist) -> None:
    """What the survivor does between the error and its exit, for diagnosing the exit itself
    (PEER_EXIT_PREP, comma-separated: sleep<S>, sync, destroy, abort, query, threads; each
    step's event is timed); none by default."""
    for step in filter(None, os.environ.get("PEER_EXIT_PREP", "").split(",")):
        try:
            if step.startswith("sleep"):
                time.sleep(float(step[5:] or 3))
            elif step == "sync" and torch.cuda.is_available():
                torch.cuda.synchronize()
            elif step == "destroy" and dist.is_initialized():
                dist.destroy_process_group()
            elif step == "abort" and dist.is_initialized():
                _bounded(dist.distributed_c10d._abort_process_group)  # every group, at once
            elif step == "query" and torch.cuda.is_available():
                # is work still queued on this stream (a replay stuck on the GPU)? never blocks
                events.say("stream_idle", idle=torch.cuda.current_stream().query())
            elif step == "threads":
                names = [t.name for t in threading.enumerate()]
                events.say("threads", names=names)
            events.say("exit_prep", step=step)
        except Exception as exc:  # recorded: the exit is what is being diagnosed
            events.say("exit_prep", step=step, error=f"{type(exc).__name__}: {str(exc)[:300]}")


def _bounded(fn, seconds: float = 30.0) -> None:
    """fn() on a thread, waited for at most `seconds` (an exit step must not hang the run)."""
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise TimeoutError(f"{fn.__name__} still running after {seconds} s")


def _continue(events: Events, torch, dist, tr, device, qkv) -> None:
    """After the error: work on a group without the faulty rank (a ring of one, a collective)."""
    try:
        solo = dist.new_group([dist.get_rank()], use_local_synchronization=True)
        with torch.no_grad():
            q, k, v = (x.detach() for x in qkv)
            out = tr.token_ring_attn(q, k, v, group=solo)[0]
            total = out.float().sum().reshape(1)
            dist.all_reduce(total, group=solo)
        if device.type == "cuda":
            torch.cuda.synchronize()
        events.say("continued", ok=bool(torch.isfinite(total).all()))
    except Exception as exc:  # what the survivor cannot do any more: recorded, not raised
        events.say("continued", ok=False, error=f"{type(exc).__name__}: {str(exc)[:300]}")


def _fault_after(events: Events, fault: str, call: int) -> None:
    """The fault after call `call` returned (also the fallback of the *_mid faults)."""
    events.say("fault", fault=fault, call=call, where="after the call")
    if fault in ("die", "die_mid"):
        os._exit(1)
    if fault in ("hang", "hang_mid"):
        time.sleep(FOREVER_S)
    raise RuntimeError(f"injected fault ({fault}) in the faulty rank's own code")


if __name__ == "__main__":
    main()
