"""How scenarios.py starts a scenario's two ranks, and stops what is left of them.

- plain: `python -c` per rank (tests/harness.plain_ranks): no launcher to stop the survivor
  when its peer exits;
- torchrun: `python -m torch.distributed.run --standalone` (the elastic agent stops every worker
  when one exits; its report names the first failure);
- fork: plain processes forked from one server that imported torch and tokenring_xdit once (the
  CPU tests' matrix: the same worker program, without paying the imports per rank). A rank
  forked there exits through SystemExit, so its interpreter shuts down as a `python -c` would.

A rank that is still alive 1 s after every survivor exited (a hung peer) is killed, as is
everything at the scenario's wall; `killed` says which.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness import plain_ranks

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("worker.py")
AFTER_SURVIVORS_S = 1.0  # then a rank still alive is a hung peer: killed
DUMP_WAIT_S = 1.5  # a rank alive at the wall gets this long to print its stacks
NATIVE_WAIT_S, NATIVE_CHARS = 20.0, 30000  # py-spy's bound per rank, and what is kept


@dataclass
class Launched:
    """What came back from one scenario's processes."""

    exit_codes: dict[int, int | None] = field(default_factory=dict)  # rank -> code (-N: signal)
    cores: dict[int, bool] = field(default_factory=dict)
    killed: list[int] = field(default_factory=list)  # ranks the harness killed
    output: dict[int, str] = field(default_factory=dict)  # rank -> stdout+stderr (-1: launcher)
    launcher_rc: int | None = None  # torchrun's own exit code
    launcher_exit_s: float | None = None  # when torchrun exited, time.time()
    ended: dict[int, float] = field(default_factory=dict)  # rank -> when seen gone, time.time()
    native: dict[int, str] = field(default_factory=dict)  # rank -> native stacks at the wall


def _env(scenario, base: dict | None = None) -> dict[str, str]:
    env = dict(base or os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    env.update(dict(scenario.env))
    if scenario.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _drain(proc: subprocess.Popen, sink: list[str]) -> threading.Thread:
    t = threading.Thread(target=lambda: sink.append(proc.stdout.read()), daemon=True)
    t.start()
    return t


def launch_plain(scenario, argv: list[str], folder: Path) -> Launched:
    program = f"from tests.peer_faults.worker import main\nmain({argv!r})\n"
    env = _env(scenario)
    env = {k: v for k, v in env.items() if k not in os.environ or os.environ[k] != v}
    procs = plain_ranks(program, 2, env, merge_stderr=True)
    sinks: list[list[str]] = [[] for _ in procs]
    readers = [_drain(p, s) for p, s in zip(procs, sinks, strict=True)]
    done = Launched()
    killed = _supervise(dict(enumerate(procs)), {0, 1} - {scenario.faulty}, scenario.wall,
                        ended=done.ended, native=done.native)  # fmt: skip
    for r, (p, reader) in enumerate(zip(procs, readers, strict=True)):
        reader.join(5)
        done.exit_codes[r] = p.returncode
        done.cores[r] = False  # Popen hides it; a core shows as "core dumped" only in a shell
        done.output[r] = "".join(sinks[r])
    done.killed = killed
    return done


def launch_torchrun(scenario, argv: list[str], folder: Path) -> Launched:
    """torchrun's own output (its report) and, per rank, the worker's (`--tee`: also on the
    console; files under `folder/torchrun/`)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           f"--max-restarts={scenario.max_restarts}", "--tee=3",
           f"--log-dir={folder / 'torchrun'}", str(WORKER), *argv]  # fmt: skip
    out = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    proc = subprocess.Popen(cmd, env=_env(scenario), start_new_session=True, **out)
    sink: list[str] = []
    reader = _drain(proc, sink)
    killed = _supervise({-1: proc}, {-1}, scenario.wall, group=True)
    exit_s = time.time()
    reader.join(5)
    text = "".join(sink)
    done = Launched(output={-1: text}, launcher_rc=proc.returncode, launcher_exit_s=exit_s)
    done.killed = [0, 1] if killed else []
    for rank, code in torchrun_failures(text).items():
        done.exit_codes[rank] = code
    for r in range(2):
        logs = sorted((folder / "torchrun").glob(f"**/attempt_*/{r}/*.log"))
        done.output[r] = "".join(f.read_text(errors="replace") for f in logs)
    return done


def torchrun_failures(text: str) -> dict[int, int]:
    """rank -> exit code of every failure torchrun's report lists (ranks that exited 0 or were
    stopped by the agent are not listed)."""
    found = re.findall(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)", text)
    return {int(r): int(c) for r, c in found}


def torchrun_root_cause(text: str) -> int | None:
    """The rank torchrun reports as the first observed failure."""
    _, _, after = text.partition("Root Cause")
    m = re.search(r"rank\s*:\s*(\d+)", after)
    return int(m.group(1)) if m else None


def _supervise(
    procs: dict,
    survivors: set,
    wall: float,
    group: bool = False,
    ended: dict | None = None,
    native: dict | None = None,
) -> list:
    """Wait until all exit; kill the rest 1 s after the survivors exited, everything at `wall`.
    Returns the keys killed; `ended` gets each key's time.time() when it was seen gone, `native`
    the native stacks of each key alive at the wall (where py-spy is installed)."""
    start, since, killed, ended = time.monotonic(), None, [], {} if ended is None else ended
    while any(p.poll() is None for p in procs.values()):
        for key, p in procs.items():
            if key not in ended and p.returncode is not None:
                ended[key] = time.time()
        now = time.monotonic()
        if since is None and all(procs[s].poll() is not None for s in survivors):
            since = now
        late = since is not None and now - since > AFTER_SURVIVORS_S
        if late or now - start > wall:
            if not late and not group:
                alive = {k: p for k, p in procs.items() if p.poll() is None}
                if native is not None:  # (py-spy only where the caller keeps its answer)
                    native.update(_native_stacks(alive))
                _dump_stacks(list(alive.values()))
            for key, p in procs.items():
                if p.poll() is None:
                    killed.append(key)
                    _kill(p, group)
            for p in procs.values():
                p.wait()
            break
        time.sleep(0.05)
    for key in procs:
        ended.setdefault(key, time.time())
    return killed


def _dump_stacks(procs: list) -> None:
    """Ask ranks still running at the wall for every thread's Python stack (worker.py
    registers faulthandler on SIGUSR1; it writes without the GIL, so a rank blocked in a C
    call holding it still answers): where a survivor that never raised is stuck."""
    for p in procs:
        try:
            p.send_signal(signal.SIGUSR1)
        except ProcessLookupError:
            pass
    time.sleep(DUMP_WAIT_S)


def _native_stacks(procs: dict) -> dict:
    """key -> every thread's native + Python stack (`py-spy dump --native`), where py-spy is on
    PATH: a rank blocked inside torch/NCCL/CUDA shows the C++ frame it waits in, which the
    Python stacks (faulthandler) cannot."""
    spy = shutil.which("py-spy")
    if spy is None:
        return {}
    found = {}
    for key, p in procs.items():
        try:
            run = subprocess.run([spy, "dump", "--native", "--pid", str(p.pid)],
                                 capture_output=True, text=True, timeout=NATIVE_WAIT_S)  # fmt: skip
            found[key] = (run.stdout + run.stderr)[-NATIVE_CHARS:]
        except (subprocess.TimeoutExpired, OSError) as exc:
            found[key] = f"py-spy failed: {type(exc).__name__}: {exc}"
    return found


def _kill(proc: subprocess.Popen, group: bool) -> None:
    """SIGKILL a rank; torchrun first gets SIGTERM (it stops its workers), then its session."""
    if not group:
        proc.kill()
        return
    try:
        proc.terminate()
        proc.wait(15)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the agent and its workers
    except ProcessLookupError:
        pass


FORK_SERVER = r"""
import gc, json, os, signal, sys, time
import torch, torch.distributed, torch._dynamo, tokenring_xdit  # once; each rank is a fork
from tests.peer_faults.worker import main
gc.freeze()  # the children's collections then leave the shared pages alone (copy-on-write)
jobs, wall, at_once = json.loads(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
keys = list(dict.fromkeys(j["key"] for j in jobs))
pids, status, killed, since, started, ended = {}, {}, [], {}, {}, {}

def start(key):
    started[key] = time.monotonic()
    for job in (j for j in jobs if j["key"] == key):
        pid = os.fork()
        if pid == 0:
            fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.environ.update(job["env"])
            main(job["argv"])  # leaves through SystemExit: this interpreter's normal exit
            sys.exit(0)
        pids[pid] = job

def running():
    return {j["key"] for p, j in pids.items() if p not in status}

while keys or len(status) < len(pids):
    while keys and len(running()) < at_once:
        start(keys.pop(0))
    pid, st = os.waitpid(-1, os.WNOHANG)
    if pid:
        status[pid], ended[pid] = st, time.time()
        continue
    now = time.monotonic()
    for pid, job in pids.items():
        if pid in status:
            continue
        key = job["key"]
        mates = [p for p, j in pids.items() if j["key"] == key and j["survivor"]]
        if all(p in status for p in mates):
            since.setdefault(key, now)
        if now - since.get(key, now) > AFTER or now - started[key] > wall:
            killed.append(pid)
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.05)
print(json.dumps([dict(key=j["key"], rank=j["rank"], code=os.waitstatus_to_exitcode(status[p]),
                       core=os.WCOREDUMP(status[p]), killed=p in killed, ended=ended[p])
                  for p, j in pids.items()]))
""".replace("AFTER", str(AFTER_SURVIVORS_S))


def launch_forked(jobs: list[tuple], wall: float, at_once: int = 4) -> dict[str, Launched]:
    """Several scenarios from one fork server, `at_once` at a time: jobs of (key, scenario,
    argv, folder); each scenario's two ranks meet on their own port; `wall` is per scenario.
    Launched per key."""
    import socket

    spec = []
    for key, scenario, argv, folder in jobs:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for r in range(2):
            env = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
                       RANK=str(r), LOCAL_RANK=str(r), **dict(scenario.env))  # fmt: skip
            log = str(Path(folder) / f"rank{r}.log")
            spec.append(dict(key=key, rank=r, env=env, argv=argv, log=log,
                             survivor=r != scenario.faulty))  # fmt: skip
    env = _env(jobs[0][1]) if jobs else dict(os.environ)
    cmd = [sys.executable, "-c", FORK_SERVER, json.dumps(spec), str(wall), str(at_once)]
    limit = wall * len(jobs) + 60
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit)
    if proc.returncode != 0:
        raise RuntimeError(f"fork server failed ({proc.returncode}): {proc.stderr[-2000:]}")
    out: dict[str, Launched] = {key: Launched() for key, *_ in jobs}
    folders = {key: Path(folder) for key, _, _, folder in jobs}
    for row in json.loads(proc.stdout.strip().splitlines()[-1]):
        done, r = out[row["key"]], row["rank"]
        done.exit_codes[r], done.cores[r] = row["code"], row["core"]
        done.ended[r] = row["ended"]
        if row["killed"]:
            done.killed.append(r)
        log = folders[row["key"]] / f"rank{r}.log"
        done.output[r] = log.read_text(errors="replace") if log.exists() else ""
    return out
