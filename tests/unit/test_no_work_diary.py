"""The project speaks only of itself: no tracked file (code, tests, data, docs, or its path) names
a round of internal work, a machine booking, or an issue of a tracker its users cannot see.
Results are named by what they measure, the hardware and the date; upstream projects' public
issues are written owner/repo#N (pytorch/pytorch#158029) or project#N (pytorch#158029)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()
ORDINAL = (
    r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth"
    r"|\d+(?:st|nd|rd|th))"
)
PATTERNS = {
    "a numbered work round": re.compile(
        rf"\b{ORDINAL}[ -](?:session|round|lease)s?\b|\b(?:session|round)s?[ -]?#?\d+\b", re.I
    ),
    "a work round by position": re.compile(
        r"\b(?:this|last|next|previous|that|the same|an earlier|a later) (?:session|lease)\b", re.I
    ),
    "a device-call folder": re.compile(r"\bcalls_s\d+|(?<=[_/])s\d{1,2}\b", re.I),
    "what a round left to the next": re.compile(r"next_owed|\bowed\b", re.I),
    "a machine booking": re.compile(r"\blease[sd]?\b|\bbooking\b", re.I),
    # not a C++ stack frame ("frame #0: ...") nor an upstream "owner/repo#N" / "project#N"
    "a tracker issue": re.compile(
        r"\bissues? #?\d+\b|(?<![\w/.-])(?<!frame )#\d{1,5}\b(?!-)", re.I
    ),
}


def _tracked() -> list[str]:
    done = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout, f"needs the checkout's git index: {done.stderr}"
    return done.stdout.splitlines()


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None  # images and other binary files: only their names are checked
    return data.decode("utf-8", errors="replace")


def offenders(name: str, text: str) -> list[str]:
    """'path:line: what: the match' for every pattern hit in a file's name or text."""
    found = []
    for what, pattern in PATTERNS.items():
        found += [f"{name}: {what} in the path: {m.group(0)!r}" for m in pattern.finditer(name)]
        for number, line in enumerate(text.splitlines(), 1):
            found += [f"{name}:{number}: {what}: {m.group(0)!r}" for m in pattern.finditer(line)]
    return found


def test_no_tracked_file_names_a_work_round_or_a_tracker_issue():
    names = _tracked()
    bad = []
    for name in names:
        path = ROOT / name
        if path.is_file() and name != SELF:  # this file's own examples below
            bad += offenders(name, _text(path) or "")
    assert len(names) > 100 and not bad, "\n".join(bad[:80]) + f"\n({len(bad)} in all)"


def test_the_patterns_tell_upstream_references_from_our_own():
    own = ["calls_s11/call6", "the calls_s9 folder", "measured in the ninth session",
           "issue 42 item 4", "(issue 44)", "see #42", "the next_owed.sh script", "owed to",
           "before_after_s6/", "Issue 41's targets", "session-2 code", "sessions 1-3",
           "this session's device time", "the 4-GPU lease"]  # fmt: skip
    upstream = ["pytorch/pytorch#158029", "pytorch#135712", "cudnn-frontend#628",
                "zhuzilin/ring-flash-attention#34", "Megatron-LM#2222", "color = '#888888'",
                "# 4 heads", "a session of pytest", "start_new_session=True", "round(x, 3)",
                "rounds of sends", "allowed", "sweep_r2_hs10.json", "released",
                "frame #0: c10::Error"]  # fmt: skip
    assert all(offenders("x.md", line) for line in own), [
        o for o in own if not offenders("x.md", o)
    ]
    flagged = [u for u in upstream if offenders("x.md", u)]
    assert not flagged, flagged
