"""Start-up hook, imported by tokenring_xdit.pth in every interpreter: os and sys only.

It waits for the first import of a host library and only then loads the entry points and arms
wrapt's post-import hooks, so a Python process that never touches yunchang/xfuser/diffusers pays
nothing but this file. TOKENRING_XDIT_AUTOPATCH=0 switches it off.
"""

import os
import sys

DISABLE_ENV = "TOKENRING_XDIT_AUTOPATCH"
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
            if os.environ.get("TOKENRING_XDIT_STRICT", "") not in ("", "0"):
                raise
            return None
        # Find the module again, now through wrapt's finder, so its post-import hook fires.
        import importlib.util

        return importlib.util.find_spec(fullname)


_finder = _FirstHostImport()


def arm() -> None:
    if os.environ.get(DISABLE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return
    if _finder not in sys.meta_path and not any(m in sys.modules for m in TRIGGERS):
        sys.meta_path.insert(0, _finder)


def disarm() -> None:
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


arm()
