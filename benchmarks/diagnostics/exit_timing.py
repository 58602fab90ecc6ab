"""How long a torchrun launch takes to end: after its last output line (a run that succeeds), or
after Ctrl-C (SIGINT to the launch's whole process group, as a terminal sends it), beside a
trivial torchrun job on the same machine at the same moment: the difference is ours.

    python benchmarks/diagnostics/exit_timing.py --repeats 3 --out exit_timing.json
    python benchmarks/diagnostics/exit_timing.py --jobs trivial pixart --interrupt-after 10

Each job runs `--repeats` times, alternating with the trivial job. With --interrupt-after S the
signal goes S seconds after the launch's first line that `--interrupt-at` names (default: the
first output line); the row has the seconds to exit and the lines printed after the signal
(and how many of them say "interrupted").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TRIVIAL = """
import sys, time, torch.distributed as dist
dist.init_process_group("gloo")
print("ready", flush=True)
if len(sys.argv) > 1:
    time.sleep(float(sys.argv[1]))
dist.destroy_process_group()
print("done", flush=True)
"""

# name -> (script under the repository, arguments); "trivial" is written to a temporary file;
# a script starting with "-m" is a module run by python itself (the CLI, not under torchrun)
JOBS = {
    "trivial": (None, []),
    "hf_llama": ("examples/hf_llama_tokenring.py", ["--steps", "3"]),
    "llm_train": ("examples/llm_train_tokenring.py", ["--steps", "3"]),
    "diffusers_flux": ("examples/diffusers_flux_tokenring.py", []),
    "pixart": ("examples/pixart_tokenring.py", ["--ring_degree", "2"]),
    "compare_cli": ("-m tokenring_xdit.tools.cli", ["compare", "--no-progress", "--out", "{tmp}"]),
    "demo_cli": (
        "-m tokenring_xdit.tools.cli",
        ["demo", "--device", "cpu", "--tokens", "256", "--iters", "2", "--no-progress"],
    ),
}


def launch(script: str, args: list[str], nproc: int, interrupt_after: float | None,
           interrupt_at: str | None, wall: float, root: Path = ROOT) -> dict:  # fmt: skip
    """One torchrun launch in checkout `root`; the times of its lines, the signal and its exit."""
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(root))
    if script.startswith("-m "):
        cmd = [sys.executable, "-m", script[3:], *args]
    else:
        cmd = [str(torchrun), "--nproc-per-node", str(nproc), script, *args]
    start = time.monotonic()
    # its own session: the signal reaches torchrun and every rank, as a terminal's Ctrl-C does
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            lines.put((time.monotonic(), line.rstrip("\n")))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[tuple[float, str]] = []
    signal_t = armed_t = None
    while True:
        now = time.monotonic()
        if now - start > wall:
            os.killpg(proc.pid, signal.SIGKILL)
        if armed_t is not None and signal_t is None and now >= armed_t:
            os.killpg(proc.pid, signal.SIGINT)
            signal_t = now
        try:
            item = lines.get(timeout=0.05)
        except queue.Empty:
            continue
        if item is None:
            break
        seen.append(item)
        wanted = interrupt_at is None or interrupt_at in item[1]
        if interrupt_after is not None and armed_t is None and wanted:
            armed_t = item[0] + interrupt_after
    rc = proc.wait()
    end = time.monotonic()
    row = dict(rc=rc, wall_s=round(end - start, 2), lines=len(seen))
    if signal_t is None:
        last = seen[-1][0] if seen else start
        row["exit_after_last_line_s"] = round(end - last, 2)
        row["last_line"] = seen[-1][1][:200] if seen else ""
    else:
        after = [text for t, text in seen if t >= signal_t]
        row.update(
            exit_after_signal_s=round(end - signal_t, 2),
            lines_after_signal=len(after),
            interrupted_lines=sum("interrupted" in text for text in after),
            tail=after[-12:],
        )
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", nargs="+", choices=JOBS, default=list(JOBS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--interrupt-after", type=float, default=None, help="seconds (see above)")
    p.add_argument("--interrupt-at", default=None, help="text of the line that starts the count")
    p.add_argument("--wall", type=float, default=900.0, help="kill a launch after this")
    p.add_argument("--label", default="", help="what else ran on the machine (e.g. '2 hogs')")
    p.add_argument("--root", type=Path, default=ROOT, help="the checkout to run (default: this)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    import tempfile

    rows: dict[str, list[dict]] = {name: [] for name in args.jobs}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        trivial = Path(tmp) / "trivial.py"
        trivial.write_text(TRIVIAL)
        for _ in range(args.repeats):
            for name in args.jobs:
                script, extra = JOBS[name]
                if name == "trivial":
                    script = str(trivial)
                    extra = ["600"] if args.interrupt_after is not None else []
                extra = [a.replace("{tmp}", tmp) for a in extra]
                at = args.interrupt_at if name != "trivial" else None
                row = launch(script, extra, args.nproc, args.interrupt_after, at, args.wall,
                             args.root.resolve())  # fmt: skip
                rows[name].append(row)
                print(name, json.dumps({k: v for k, v in row.items() if k != "tail"}), flush=True)
    key = "exit_after_signal_s" if args.interrupt_after is not None else "exit_after_last_line_s"
    summary = {
        name: dict(median_s=statistics.median(r[key] for r in got), runs=[r[key] for r in got])
        for name, got in rows.items()
    }
    result = dict(
        measure=key,
        summary=summary,
        rows=rows,
        load_1min=dict(before=round(load_before, 2), after=round(os.getloadavg()[0], 2)),
        cpus=os.cpu_count(),
        label=args.label,
        machine=platform.platform(),
        date=time.strftime("%Y-%m-%d"),
        command=" ".join(sys.argv),
    )
    print(json.dumps(dict(summary=summary, load_1min=result["load_1min"]), indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
