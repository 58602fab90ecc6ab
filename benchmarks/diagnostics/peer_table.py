"""A peer_death.py matrix's results as the markdown rows of docs/troubleshooting.md's tables
(`peer_death.py --table results.json`)."""

from __future__ import annotations

import re

KINDS = (  # what part of TokenRing raised, from the message
    ("input check", r"input check"),
    ("transfer at step {}", r"transfer at step (\d+)"),
    ("watchdog (deadline)", r"did not finish within"),
    ("ring unusable", r"unusable after an earlier failure"),
    ("communicator setup", r"could not create the communicators"),
)


def _kind(message: str) -> str:
    for label, pattern in KINDS:
        m = re.search(pattern, message)
        if m:
            return label.format(*m.groups())
    return message[:60]


def table(results: list[dict]) -> str:
    """Markdown rows of a matrix's results (docs/troubleshooting.md's peer-death tables)."""
    rows = ["| path | fault | launcher | survivor's first error (s after the fault) | names "
            "rank / step | survivor's exit | torchrun: rc, blamed rank | verdict |",
            "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        if r.get("not_run"):
            rows.append(f"| {r['name']} | | | not run (budget) | | | | |")
            continue
        s = r["survivors"][0]
        err = s["first_error"]
        first = f"`{err['type']}`, {_kind(err['message'])} ({s['delay_s']:.2f} s)" if err else (
            "none")  # fmt: skip
        exit_ = "stopped by the agent" if s["stopped_by_launcher"] else f"{s['exit_code']}"
        exit_ = "SIGABRT" if s["sigabrt"] else exit_
        if s["killed_by_harness"]:
            exit_ += " (killed at the wall)"
        tr = r.get("torchrun")
        trun = f"{tr['rc']}, rank {tr['root_cause_rank']}" if tr else ""
        then = " (then works on)" if r["then"] == "continue" else ""
        then += " (group timeout, no variable)" if r.get("deadline_from") == "group" else ""
        verdict = "ok" if not r["problems"] else "; ".join(p[:80] for p in r["problems"])
        rows.append(f"| {r['path']}{then} | {r['fault']} | {r['launcher']} | {first} | "
                    f"{'yes' if s['names_rank'] else 'no'} / {'yes' if s['names_step'] else 'no'}"
                    f" | {exit_} | {trun} | {verdict} |")  # fmt: skip
    return "\n".join(rows)
