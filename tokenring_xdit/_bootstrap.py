"""Start-up hook, imported by tokenring_xdit.pth in every interpreter: os and sys only (and
_envflags.py, which imports nothing).

It waits for the first import of a host library and only then loads the entry points and arms
wrapt's post-import hooks, so a Python process that never touches yunchang/xfuser/diffusers pays
nothing but this file. TOKENRING_XDIT_AUTOPATCH=0 switches it off; it and STRICT are parsed as
config.py parses them, and a value that is not a boolean leaves patching off, with a message.
"""

import os
import sys

from tokenring_xdit._envflags import AUTOPATCH, STRICT, parse_flag

DISABLE_ENV, STRICT_ENV = AUTOPATCH[0], STRICT[0]
# Top-level modules whose first import arms the hooks; tests keep this equal to the entry points.
TRIGGERS = ("yunchang", "xfuser", "diffusers")


class _FirstHostImport:
    """A meta-path finder that fires once, on the first import of a trigger module."""

    def find_spec(self, fullname, path=None, target=None):
        if path is not None or fullname not in TRIGGERS:
            return None
        disarm()
        try:
            from tokenring_xdit.patches import arm_entry_points

            arm_entry_points()
        except Exception as exc:  # never break the host's import
            sys.stderr.write(f"tokenring_xdit: automatic patching disabled: {exc!r}\n")
            if _flag(STRICT_ENV, STRICT[1]) is not False:  # strict, or not a boolean: refuse too
                raise
            return None
        # Find the module again, now through wrapt's finder, so its post-import hook fires.
        import importlib.util

        return importlib.util.find_spec(fullname)


_finder = _FirstHostImport()


def _flag(var: str, default: bool) -> bool | None:
    """The boolean `var`, or None (with a message) when it is not one."""
    try:
        return parse_flag(os.environ.get(var), default, var)
    except ValueError as exc:
        sys.stderr.write(f"tokenring_xdit: {exc}\n")
        return None


def arm() -> None:
    on = _flag(DISABLE_ENV, AUTOPATCH[1])
    if on is None:
        sys.stderr.write("tokenring_xdit: automatic patching is off until that is fixed\n")
    if not on:
        return
    if _finder not in sys.meta_path and not any(m in sys.modules for m in TRIGGERS):
        sys.meta_path.insert(0, _finder)


def disarm() -> None:
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


arm()
