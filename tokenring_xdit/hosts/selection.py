"""Which ring xDiT runs: its own (torch's all-gather ring) or TokenRing.

Sources, strongest first: `set_xdit_ring_impl()` (Python), the `--ring_impl_type` flag of xDiT's
parsers (read when xFuserArgs.from_cli_args / from_runner_args runs, so in every torchrun worker),
the TOKENRING_XDIT_RING_IMPL environment variable (inherited by every worker), then "default".
"""

from __future__ import annotations

from .. import config

RING_IMPL_ENV = config.ENV["ring_impl"][0]
DEFAULT, TOKEN_RING = config.RING_IMPLS
XDIT_RING_IMPLS = config.RING_IMPLS

_chosen: dict[str, str | None] = {"python": None, "flag": None}


def validate_ring_impl(name: str, source: str) -> str:
    if name not in XDIT_RING_IMPLS:
        raise ValueError(
            f"unknown ring implementation {name!r} (from {source}); valid values: "
            f"{', '.join(XDIT_RING_IMPLS)}"
        )
    return name


def set_xdit_ring_impl(name: str | None) -> None:
    """Choose xDiT's ring for this process ("token_ring" or "default"); None clears the choice."""
    _chosen["python"] = None if name is None else validate_ring_impl(name, "set_xdit_ring_impl")


def set_from_flag(name: str | None) -> None:
    _chosen["flag"] = None if name is None else validate_ring_impl(name, "--ring_impl_type")


def xdit_ring_impl() -> tuple[str, str]:
    """(implementation, where the choice came from)."""
    if _chosen["python"]:
        return _chosen["python"], "set_xdit_ring_impl()"
    if _chosen["flag"]:
        return _chosen["flag"], "--ring_impl_type"
    env = config.current().ring_impl
    if env:
        return validate_ring_impl(env, RING_IMPL_ENV), RING_IMPL_ENV
    return DEFAULT, "default"


def reset() -> None:
    _chosen.update(python=None, flag=None)
