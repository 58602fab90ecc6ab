"""The patch table as text: the audit file patches/README.md and the `tokenring-xdit patches`
listing (the table itself is data only, in table.py)."""

from __future__ import annotations

from .table import PATCH_TABLE

__all__ = ["to_markdown", "to_lines"]


def to_markdown() -> str:
    """The audit document for patches/README.md."""
    lines = [
        "# Patch points",
        "",
        "Every change tokenring_xdit makes to a host library, generated from",
        "`tokenring_xdit/patches/table.py` by `tokenring-xdit patches --markdown`",
        "(a test fails when this file and the table differ, and every change the code makes",
        "names a row). The `automatic` patches of a host are applied together when its trigger",
        "module is imported (or by `tokenring_xdit.install()`); `CPU mode` rows only after",
        "`tokenring_xdit.patches.xfuser_cpu.enable()` (xfuser) or `diffusers_cpu.enable()`",
        "(diffusers), each when its module is imported, and acting only where no accelerator",
        "device exists (with a CPU build of torch, or a CUDA build on a machine without a GPU);",
        "`runtime` rows by tokenring_xdit itself. Only the host versions listed are patched,",
        "and `tokenring_xdit.uninstall()` reverts every row.",
        "Set `TOKENRING_XDIT_AUTOPATCH=0` to keep them from being applied automatically.",
        "",
        "| id | switch | host | trigger | target | kind | versions | change |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in PATCH_TABLE:
        lines.append(
            f"| `{p.id}` | {p.switch} | {p.host} | `{p.trigger}` | `{p.target}` | {p.kind} | "
            f"`{p.versions}` | {p.change} |"
        )
    return "\n".join(lines) + "\n"


def to_lines() -> list[str]:
    """One line per row: id, kind, host and versions, target (`tokenring-xdit patches`)."""
    return [f"{p.id:32} {p.kind:15} {p.host}{p.versions:14} {p.target}" for p in PATCH_TABLE]
