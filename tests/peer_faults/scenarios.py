"""Peer-fault scenarios: a peer that dies, hangs or raises in the middle of a TokenRing loop, and
what the survivor sees, per path x fault x launcher, on GPUs (NCCL) or CPU (gloo).

Two ranks run tests/peer_faults/worker.py (its docstring: the paths and faults); rank 1 faults
at call `fault_at`, rank 0 keeps calling and exits 3 when it catches TokenRingCommError. Per
scenario (`run`, `run_many`), as a dict: for every survivor its first error (type, message,
call, thread), seconds from the fault to that error, exit code (-6: SIGABRT; -9: killed by this
harness after the wall; None under torchrun when the agent stopped it), whether the message
names the faulty rank ("global rank 1") and the step ("step N"); torchrun's exit code and the
rank its report blames. `problems` holds a result to the rules; GPU_MATRIX / CPU_MATRIX are the
lists tests/gpu/test_gpu_peer_death.py and tests/distributed/test_peer_death.py run, and
benchmarks/diagnostics/peer_death.py runs any of them from the command line.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from tests.peer_faults import launch as peer_launch
from tests.peer_faults.worker import EXIT_NAMED, FAULTS

LAUNCHERS = ("plain", "torchrun", "fork")
STAYS = ("hang", "hang_mid", "raise_stay")  # the faulty process stays alive


@dataclass(frozen=True)
class Scenario:
    path: str = "train"
    fault: str = "die"
    launcher: str = "plain"
    device: str = "cuda"
    tokens: int = 16384
    heads: int = 32
    calls: int = 400
    fault_at: int = 30
    deadline: float = 8.0
    warmup_deadline: float | None = None
    compile_backend: str = "inductor"
    max_restarts: int = 0
    wall: float = 120.0
    faulty: int = 1
    then: str = "exit"  # or "continue": the survivor first works on a group of its own
    deadline_from: str = "env"  # or "group": init_process_group(timeout=deadline), no variable
    env: tuple[tuple[str, str], ...] = ()  # more environment for the ranks (e.g. NCCL settings)
    expect_step: bool = True  # False: a replay without step marks names its peers only
    # a slow or busy machine's factor (tests/speed.py): the verdict's SLACK_S and EXIT_S grow
    # with it (the caller stretches deadline and wall the same way)
    stretch: float = 1.0

    @property
    def name(self) -> str:
        extra = "-continue" if self.then == "continue" else ""
        extra += f"-restarts{self.max_restarts}" if self.max_restarts else ""
        extra += "-grouptimeout" if self.deadline_from == "group" else ""
        extra += "-marks" if ("TOKENRING_XDIT_REPLAY_STEP_MARKS", "1") in self.env else ""
        return f"{self.path}-{self.fault}-{self.launcher}-{self.device}{extra}"

    def argv(self, events: Path) -> list[str]:
        argv = ["--path", self.path, "--fault", self.fault, "--fault-at", str(self.fault_at),
                "--faulty", str(self.faulty), "--calls", str(self.calls), "--tokens",
                str(self.tokens), "--heads", str(self.heads), "--deadline", str(self.deadline),
                "--compile-backend", self.compile_backend, "--events", str(events),
                "--device", self.device, "--then", self.then,
                "--deadline-from", self.deadline_from]  # fmt: skip
        if self.warmup_deadline is not None:
            argv += ["--warmup-deadline", str(self.warmup_deadline)]
        return argv


def _g(path: str, fault: str, launcher: str = "plain", **kw) -> Scenario:
    return Scenario(path, fault, launcher, **kw)


# Every GPU scenario (2 GPUs, NCCL; bf16, 16k tokens, 32 heads, deadline 8 s), the longest
# first. Each takes ~35 s (start, 30 warm-up calls, deadline, exit); one whose survivor gets no
# error ends at torch's own NCCL timeout (SIGABRT, ~30 s after the fault) or is killed at its
# wall. About 6 min at --jobs 6.
GPU = dict(wall=75.0)
# A graph replay's error names its peers, not its step (`problems` has that rule), unless replay
# step marks are on (off by default: their events cost graphed calls 3-20 %): the replays run as
# users get them, and the "-marks" scenarios check the named step with the marks on.
REPLAY = dict(GPU, expect_step=False)
MARKS = (("TOKENRING_XDIT_REPLAY_STEP_MARKS", "1"),)
SEPARATE_STORES = (("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"),)
GPU_MATRIX = (
    # a rank may compile seconds longer than its peer: the warm-up calls get 60 s (the ring's
    # communicators are made with it; the calls from the fault on have the 8 s deadline)
    *(_g("compiled", f, fault_at=10, warmup_deadline=60.0, wall=150.0) for f in ("die", "hang")),
    # torchrun keeps its store across restarts and torch can hand the restarted workers the
    # previous attempt's addresses (pytorch#135712; measured on 4 x H200, 2026-11-27: the restarted
    # ring's gloo set-up was refused): run it as docs/troubleshooting.md tells users to
    _g("train", "die", "torchrun", max_restarts=1, wall=120.0, env=SEPARATE_STORES),
    *(_g("infer_graphed", f, **REPLAY) for f in ("die", "hang", "raise_exit", "raise_stay")),
    *(_g("infer_graphed", f, env=MARKS, **GPU) for f in ("die", "hang")),
    *(_g("infer_eager", f, **GPU) for f in ("die", "die_mid", "hang", "raise_exit")),
    *(
        _g("train", f, **GPU)
        for f in ("die", "die_mid", "hang", "hang_mid", "raise_exit", "raise_stay")
    ),  # fmt: skip
    *(_g("ipc", f, env=MARKS, **GPU) for f in ("die", "hang")),
    *(_g("packed", f, **GPU) for f in ("die", "hang")),
    _g("infer_graphed", "die", then="continue", **REPLAY),
    _g("train", "die", then="continue", **GPU),
    _g("infer_graphed", "hang", deadline_from="group", **REPLAY),
    _g("train", "die", deadline_from="group", **GPU),
    *(_g("train", f, "torchrun", **GPU) for f in ("die", "hang", "raise_exit")),
    *(_g("infer_graphed", f, "torchrun", **REPLAY) for f in ("die", "hang")),
)
# The CPU (gloo) matrix of tests/distributed/test_peer_death.py: tiny, deadline 3 s, dynamo's
# "eager" backend (Inductor's C++ build would dominate on 2 cores; the op and its errors are the
# same).
CPU = dict(device="cpu", tokens=64, heads=4, calls=60, fault_at=4, deadline=3.0,
           compile_backend="eager", wall=60.0)  # fmt: skip
CPU_MATRIX = (  # longest first (compiling)
    *(_g("compiled", f, "fork", **CPU) for f in ("die_mid", "hang")),
    *(_g("train", f, "fork", **CPU) for f in FAULTS),
    _g("train", "die_mid", "fork", then="continue", **CPU),
    _g("train", "hang", "fork", deadline_from="group", **CPU),
    *(
        _g(p, f, "fork", **CPU)
        for p, f in (
            ("infer_eager", "die_mid"),
            ("infer_eager", "hang"),
            ("packed", "die_mid"),
            ("packed", "raise_exit"),
        )
    ),  # fmt: skip
    *(_g("train", f, "torchrun", **CPU) for f in ("die", "hang")),
    _g("train", "die_mid", "plain", **CPU),
)


def outcome(scenario: Scenario, folder: Path, done: peer_launch.Launched, wall_s: float) -> dict:
    """The scenario's result: the old single-survivor fields plus one entry per survivor."""
    events = _events(folder)
    fault = next((e for e in events if e["event"] == "fault"), None)
    fault_t = fault["t"] if fault else None
    text = done.output.get(-1) or "\n".join(done.output.values())
    torchrun = scenario.launcher == "torchrun"
    survivors = []
    for rank in sorted({0, 1} - {scenario.faulty}):
        mine = [e for e in events if e["rank"] == rank]
        first = next((e for e in mine if e["event"] == "error"), None)
        message = first["message"] if first else ""
        code = done.exit_codes.get(rank)
        exiting = next((e for e in mine if e["event"] == "exiting"), None)
        if torchrun and code is None and exiting and any(e["event"] == "atexit" for e in mine):
            code = exiting["code"] if rank not in done.killed else None  # exited, not listed
        own = done.output.get(rank, text)
        survivors.append(dict(
            rank=rank,
            first_error=first and {k: first[k] for k in ("type", "message", "call", "thread")},
            delay_s=None if first is None or fault_t is None else round(first["t"] - fault_t, 3),
            exit_code=code,
            stopped_by_launcher=torchrun and exiting is None and first is None,
            exit_after_error_s=_exit_after(mine, first),
            gone_after_error_s=None if first is None or rank not in done.ended
            else round(done.ended[rank] - first["t"], 3),  # fmt: skip
            reached_atexit=any(e["event"] == "atexit" for e in mine),
            killed_by_harness=rank in done.killed,
            sigabrt=code == -6 or "terminate called" in own or "SIGABRT" in own,
            core=bool(done.cores.get(rank)) or "core dumped" in own,
            names_rank=bool(re.search(rf"global rank {scenario.faulty}\b", message)),
            names_step=bool(re.search(r"\bstep \d+", message)),
            finished=any(e["event"] == "finished" for e in mine),
            continued=next(({k: e.get(k) for k in ("ok", "error")} for e in mine
                            if e["event"] == "continued"), None),  # fmt: skip
        ))  # fmt: skip
    s0 = survivors[0]
    result = (
        dataclasses.asdict(scenario)
        | dict(
            name=scenario.name,
            mode=scenario.path,  # the old field names, kept
            timeout_s=scenario.deadline,
            graphs=int(scenario.path not in ("infer_eager",)),
            fault_event=fault and {k: fault.get(k) for k in ("fault", "call", "where")},
            faulty_exit_code=done.exit_codes.get(scenario.faulty),
            survivors=survivors,
            survivor_exit_code=s0["exit_code"],
            survivor_error=s0["first_error"],
            error_after_death_s=s0["delay_s"],
            survivor_finished=s0["finished"],
            sigabrt=any(s["sigabrt"] for s in survivors),
            wall_s=round(wall_s, 2),
            timeline=_timeline(events),
            stderr_tail=text[-6000:],  # room for a stuck rank's thread stacks (peer_launch)
            native_stacks=done.native,  # rank -> py-spy's native stacks at the wall, if any
        )
    )
    if torchrun:
        result["torchrun"] = dict(
            rc=done.launcher_rc,
            root_cause_rank=peer_launch.torchrun_root_cause(text),
            failures=peer_launch.torchrun_failures(text),
            exit_after_fault_s=None if fault_t is None or done.launcher_exit_s is None
            else round(done.launcher_exit_s - fault_t, 2),
        )  # fmt: skip
    result["problems"] = problems(result)
    return result


def _events(folder: Path) -> list[dict]:
    found = []
    for f in sorted(folder.glob("rank*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line cut by the process's death
    return sorted(found, key=lambda e: e["t"])


def _timeline(events: list[dict]) -> list[str]:
    """Every event as "rank R event +seconds" from the first rank's start (its process's
    start of init_process_group)."""
    starts = [e["t0"] for e in events if e["event"] == "started"]
    t0 = min(starts) if starts else (events[0]["t"] if events else 0.0)

    def detail(e: dict) -> str:  # an exit step's name, outcome and such (not the messages)
        extra = {k: v for k, v in e.items() if k in ("step", "idle", "error", "names")}
        return f" {extra}" if extra else ""

    return [f"rank {e['rank']} {e['event']} +{e['t'] - t0:.2f}{detail(e)}" for e in events]


def _exit_after(mine: list[dict], first: dict | None) -> float | None:
    last = next((e for e in reversed(mine) if e["event"] == "atexit"), None)
    return None if first is None or last is None else round(last["t"] - first["t"], 3)


def run(scenario: Scenario) -> dict:
    """Run one scenario (plain or torchrun; fork goes through run_many)."""
    if scenario.launcher == "fork":
        return run_many([scenario])[0]
    with tempfile.TemporaryDirectory(prefix="peer_death_") as tmp:
        folder = Path(tmp)
        start = time.time()
        launch = peer_launch.launch_torchrun if scenario.launcher == "torchrun" else (
            peer_launch.launch_plain)  # fmt: skip
        done = launch(scenario, scenario.argv(folder), folder)
        return outcome(scenario, folder, done, time.time() - start)


def run_many(
    scenarios: list[Scenario],
    jobs: int = 1,
    budget: float | None = None,
    forks: int = 4,
    on_result: Callable[[list], None] | None = None,
) -> list:
    """Every scenario's result, in order, `jobs` at a time (the fork scenarios as one job: one
    server, `forks` at a time); those not started within `budget` s: {"name", "not_run": True}.
    `on_result(results so far)` after each finished job (a killed run keeps what it saw)."""
    start = time.time()
    forked = [i for i, s in enumerate(scenarios) if s.launcher == "fork"]

    def fork_batch(_: None) -> dict[int, dict]:
        with tempfile.TemporaryDirectory(prefix="peer_death_") as tmp:
            folders = {i: Path(tmp) / str(i) for i in forked}
            batch = []
            for i in forked:
                folders[i].mkdir()
                batch.append((str(i), scenarios[i], scenarios[i].argv(folders[i]), folders[i]))
            wall = max(scenarios[i].wall for i in forked)
            done = peer_launch.launch_forked(batch, wall, forks)
            wall = time.time() - start
            return {i: outcome(scenarios[i], folders[i], done[str(i)], wall) for i in forked}

    def one(i: int) -> dict[int, dict]:
        if budget is not None and time.time() - start > budget:
            return {i: {"name": scenarios[i].name, "not_run": True}}
        return {i: run(scenarios[i])}

    tasks = [(fork_batch, None)] if forked else []
    tasks += [(one, i) for i in range(len(scenarios)) if i not in forked]
    results: dict[int, dict] = {}
    with ThreadPoolExecutor(max(jobs, 1)) as pool:
        for future in as_completed([pool.submit(fn, arg) for fn, arg in tasks]):
            results.update(future.result())
            if on_result is not None:
                on_result([results[i] for i in sorted(results)])
    return [results[i] for i in range(len(scenarios))]


SLACK_S = 6.0  # the survivor's error may come this long after the deadline
EXIT_S = 10.0  # then it is gone within this (measured 0.3-3 s; a stuck teardown waits 30 s)


def problems(result: dict) -> list[str]:
    """What the failure contract asks that this result does not show (empty: all of it).
    Plain processes: every survivor raises TokenRingCommError in its own thread within
    deadline + SLACK_S, naming the faulty rank and the step, and exits with the program's code
    (3) within EXIT_S, no SIGABRT or core.
    torchrun, when the faulty rank exits: torchrun fails naming it as the root cause; a survivor
    is stopped by the agent or has raised as above first. torchrun, when it stays (hangs):
    the survivor raises as above and exits 3, torchrun names it and stops the hung rank."""
    found = []
    peer_exits = result["fault"] not in STAYS
    torchrun = result["launcher"] == "torchrun"
    stretch = result.get("stretch", 1.0)
    for s in result["survivors"]:
        who = f"rank {s['rank']}: "
        err = s["first_error"]
        stopped = torchrun and peer_exits and (err is None or s["exit_code"] in (None, -15))
        if s["sigabrt"] or s["core"]:
            found.append(who + f"SIGABRT or core (exit code {s['exit_code']})")
        if err is None:
            if not stopped:
                found.append(who + "no error raised")
            continue
        if err["type"] != "TokenRingCommError" or err["thread"] != "MainThread":
            found.append(who + f"raised {err['type']} in {err['thread']}: {err['message'][:200]}")
        if s["delay_s"] is None or s["delay_s"] > result["deadline"] + SLACK_S * stretch:
            found.append(who + f"error {s['delay_s']} s after the fault")
        if not (s["names_rank"] and (s["names_step"] or not result.get("expect_step", True))):
            found.append(who + f"message names rank: {s['names_rank']}, step: "
                         f"{s['names_step']}: {err['message'][:300]}")  # fmt: skip
        if not stopped and s["exit_code"] != EXIT_NAMED:
            found.append(who + f"exit code {s['exit_code']}, not {EXIT_NAMED}")
        if s["killed_by_harness"]:
            found.append(who + "still running at the wall: killed")
        elif (s["gone_after_error_s"] or 0) > EXIT_S * stretch:
            found.append(who + f"exited {s['gone_after_error_s']} s after its error")
        if result["then"] == "continue" and not (s["continued"] or {}).get("ok"):
            found.append(who + f"could not keep working on its own group: {s['continued']}")
    if torchrun:
        tr = result["torchrun"]
        blamed = result["faulty"] if peer_exits else 0
        if tr["rc"] in (0, None) or tr["root_cause_rank"] != blamed:
            found.append(f"torchrun rc {tr['rc']}, root cause rank {tr['root_cause_rank']}, "
                         f"expected rank {blamed}")  # fmt: skip
    return found
