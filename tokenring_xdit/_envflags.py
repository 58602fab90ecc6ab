"""Parsing shared by config.py and the start-up hook (_bootstrap.py imports nothing heavier than
os/sys, so this module imports nothing): booleans, the closest valid name of a misspelled
variable, and the two settings the hook reads. Nothing here reads the environment; the callers
pass the raw values."""

from __future__ import annotations

ENV_PREFIX = "TOKENRING_XDIT_"
# The two settings the start-up hook reads before anything else may be imported:
# (variable, default, meaning). config.py lists them with the others (README's table).
AUTOPATCH = (
    ENV_PREFIX + "AUTOPATCH",
    True,
    "`0`: the `.pth` bootstrap patches nothing; call `tokenring_xdit.install()` yourself",
)
STRICT = (
    ENV_PREFIX + "STRICT",
    False,
    "`1`: a patch that cannot apply raises instead of warning (the tests set it)",
)

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


def parse_flag(raw: str | None, default: bool, var: str) -> bool:
    """A boolean setting: unset or blank is `default`; anything not in TRUE/FALSE is an error."""
    if raw is None or not raw.strip():
        return default
    text = raw.strip().lower()
    if text in TRUE:
        return True
    if text in FALSE:
        return False
    raise ValueError(f"{var}={raw!r}: use one of {', '.join(TRUE + FALSE)}")


def misspelled(names, prefix: str, known) -> list[tuple[str, str | None]]:
    """(name, the closest known name or None) for each name with our prefix that we don't know."""
    unknown = [n for n in names if n.startswith(prefix) and n not in known]
    if not unknown:
        return []
    import difflib  # only when something is misspelled

    known = sorted(known)
    return [
        (n, next(iter(difflib.get_close_matches(n, known, n=1, cutoff=0.6)), None)) for n in unknown
    ]
