"""How TokenRing is configured: one frozen object, and the only reader of TOKENRING_XDIT_*.

Every setting comes from the environment (torchrun's workers inherit the launcher's), read here
and nowhere else; `current()` re-reads it only when one of our variables changed, so code that
sets `os.environ[...]` in-process (examples, benchmarks) is honoured without a per-call parse.
Python callers can pass a `RingConfig` to `token_ring_attn(config=...)` instead (a planner's
output, a test's). The `.pth` bootstrap reads TOKENRING_XDIT_AUTOPATCH itself: it runs in every
interpreter and must not import even this module.

A value outside a variable's allowed set is a ValueError naming the allowed ones (booleans take
1/0, true/false, yes/no, on/off). Settings that decide what a call does (final pieces, CUDA graphs,
validate mode, the ring choice and what `auto` decides from) are agreed across the ring before
any transfer (ring/agree/); ranks that differ fail together with one clear error.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass

from ._envflags import FALSE, TRUE, misspelled, parse_flag

__all__ = ["RingConfig", "ENV", "current"]

PREFIX = "TOKENRING_XDIT_"
# field -> (environment variable, default text, one-line meaning) -- README's table comes from here
ENV: dict[str, tuple[str, str, str]] = {
    "ring_impl": (
        PREFIX + "RING_IMPL",
        "",
        "`token_ring`, `default` or `auto` (per call, from the planner's model): the ring xDiT "
        "and diffusers run, like `--ring_impl_type`",
    ),
    "fabric": (
        PREFIX + "FABRIC",
        "",
        "the links `auto` predicts with (`nvswitch`, `nvlink-pair`, `pcie`, `p2p-off`, `ib`); "
        "unset: `p2p-off` if `NCCL_P2P_DISABLE=1`, else `nvswitch`",
    ),
    "autopatch": (
        PREFIX + "AUTOPATCH",
        "1",
        "`0`: the `.pth` bootstrap patches nothing; call `tokenring_xdit.install()` yourself",
    ),
    "cuda_graphs": (
        PREFIX + "CUDA_GRAPHS",
        "1",
        "`0`: run each ring call eagerly instead of replaying a CUDA graph per input signature",
    ),
    "cuda_graph_transformer": (
        PREFIX + "CUDA_GRAPH_TRANSFORMER",
        "0",
        "`1`: replay xDiT's whole transformer forward as a CUDA graph per step",
    ),
    "fused_merge": (
        PREFIX + "FUSED_MERGE",
        "1",
        "`0`: merge partials with torch ops instead of the Triton pass inside graphs",
    ),
    "final_chunks": (
        PREFIX + "FINAL_CHUNKS",
        "1",
        "pieces of the last partial's return (2 was faster only for Flux 1024 px at ring 2)",
    ),
    "validate": (
        PREFIX + "VALIDATE",
        "auto",
        "when ranks exchange the input check: `always` (every call), `signature` (new input "
        "signatures only), `auto` (always on gloo, signature on NCCL)",
    ),
    "strict": (
        PREFIX + "STRICT",
        "0",
        "`1`: a patch that cannot apply raises instead of warning (the tests set it)",
    ),
    "timeout": (
        PREFIX + "TIMEOUT",
        "",
        "seconds any TokenRing wait may take before it raises `TokenRingCommError`; unset: the "
        "smaller of the ring group's and the world group's timeouts (read when a ring's "
        "communicators are made); `token_ring_attn(config=RingConfig(timeout=...))` sets one "
        "call's",
    ),
    "transport": (
        PREFIX + "TRANSPORT",
        "nccl",
        "how ring ranks move data: `nccl` (the group's torch.distributed backend: NCCL, or gloo "
        "for CPU tensors), `ipc` (CUDA IPC copies into the peer's memory: several ranks on one "
        "GPU, or GPUs that can access each other; needs `cuda-bindings`), `auto` (`ipc` when "
        "ranks share a GPU or CUDA tensors meet a gloo group, else `nccl`)",
    ),
}

_TRUE, _FALSE = TRUE, FALSE  # shared with the start-up hook (_envflags.py)
RING_IMPLS = ("default", "token_ring", "auto")
# where a host's ring choice came from, weakest first (hosts/selection.py; the agreement's codes)
RING_IMPL_SOURCES = ("default", "set_xdit_ring_impl()", "--ring_impl_type", PREFIX + "RING_IMPL")
# Not ours, but it changes the links `auto` predicts with; read here like our own variables.
NCCL_P2P_DISABLE = "NCCL_P2P_DISABLE"
VALIDATE_MODES = ("auto", "always", "signature")
TRANSPORTS = ("nccl", "ipc", "auto")
FABRICS = ("nvswitch", "nvlink-pair", "pcie", "p2p-off", "ib")  # planner/fabric.py's names
FABRIC_ALIASES = {"nvlink": "nvswitch", "p2p_off": "p2p-off", "infiniband": "ib"}


@dataclass(frozen=True)
class RingConfig:
    """Every TokenRing setting. Fields are documented in `ENV` (and README's table)."""

    ring_impl: str | None = None  # None: not chosen by the environment
    fabric: str | None = None  # None: `auto` derives it (auto_fabric)
    nccl_p2p_disabled: bool = False
    cuda_graphs: bool = True
    cuda_graph_transformer: bool = False
    fused_merge: bool = True
    # -1 marks an invalid environment value: the input check rejects it on every rank, so ranks
    # that disagree fail together instead of one raising alone.
    final_chunks: int = 1
    validate: str = "auto"
    strict: bool = False
    timeout: float | None = None  # seconds; None: from the groups (comm/groups.py)
    transport: str = "nccl"  # agreed across the ring by the input check (ring/agree/)

    @classmethod
    def from_env(cls, environ: os._Environ | dict | None = None) -> RingConfig:
        """The environment's settings; ValueError naming the allowed values for a bad one."""
        environ = os.environ if environ is None else environ
        _warn_misspelled(environ)
        raw = {name: environ.get(var) for name, (var, _, _) in ENV.items()}
        return cls(
            ring_impl=_choice(raw["ring_impl"], "ring_impl", RING_IMPLS),
            fabric=_fabric(raw["fabric"]),
            nccl_p2p_disabled=_flag(environ.get(NCCL_P2P_DISABLE), False, NCCL_P2P_DISABLE),
            cuda_graphs=_flag(raw["cuda_graphs"], True, ENV["cuda_graphs"][0]),
            cuda_graph_transformer=_flag(
                raw["cuda_graph_transformer"], False, ENV["cuda_graph_transformer"][0]
            ),
            fused_merge=_flag(raw["fused_merge"], True, ENV["fused_merge"][0]),
            final_chunks=_positive_or_invalid(raw["final_chunks"]),
            validate=_choice(raw["validate"], "validate", VALIDATE_MODES, lower=True) or "auto",
            strict=_flag(raw["strict"], False, ENV["strict"][0]),
            timeout=_seconds(raw["timeout"]),
            transport=_choice(raw["transport"], "transport", TRANSPORTS, lower=True) or "nccl",
        )

    def replace(self, **changes) -> RingConfig:
        return dataclasses.replace(self, **changes)

    def auto_fabric(self) -> str:
        """The fabric `auto` predicts with: from the environment only (cheap, and the same on
        every rank, which inherits the launcher's), never from probing the links."""
        if self.fabric:
            return self.fabric
        # NCCL then stages every transfer through host memory: the planner's "p2p-off" links
        return "p2p-off" if self.nccl_p2p_disabled else "nvswitch"


def _flag(raw: str | None, default: bool, var: str) -> bool:
    return parse_flag(raw, default, var)  # the start-up hook parses AUTOPATCH/STRICT the same


_WARNED: set[str] = set()


def _warn_misspelled(environ) -> None:
    """A TOKENRING_XDIT_* variable we don't know is a typo: say so once, with the closest name."""
    for name, close in misspelled(list(environ), PREFIX, _VARS):
        if name in _WARNED:
            continue
        _WARNED.add(name)
        hint = f"did you mean {close}?" if close else f"valid names: {', '.join(_VARS[:-1])}"
        warnings.warn(
            f"{name} is not a tokenring_xdit setting and is ignored; {hint}", stacklevel=4
        )


def _choice(raw: str | None, field: str, allowed: tuple[str, ...], lower: bool = False):
    """None when unset; the value when allowed; ValueError naming the allowed values."""
    text = (raw or "").strip()
    text = text.lower() if lower else text
    if not text:
        return None
    if text not in allowed:
        raise ValueError(f"{ENV[field][0]}={raw!r}: use one of {', '.join(allowed)}")
    return text


def _fabric(raw: str | None) -> str | None:
    name = _choice(raw, "fabric", FABRICS + tuple(FABRIC_ALIASES), lower=True)
    return FABRIC_ALIASES.get(name, name) if name else None


def _seconds(raw: str | None) -> float | None:
    if raw is None or not raw.strip():
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ValueError(f"{ENV['timeout'][0]}={raw!r}: use a positive number of seconds")
    return value


def _positive_or_invalid(raw: str | None) -> int:
    if raw is None:
        return 1
    try:
        value = int(raw)
    except ValueError:
        return -1
    return value if value >= 1 else -1


_VARS = (*(var for var, _, _ in ENV.values()), NCCL_P2P_DISABLE)
_cache: list = [None, None]  # [environment snapshot, RingConfig]


# CPython's os.environ keeps encoded values in `_data`; other Pythons take the public path.
_DATA = getattr(os.environ, "_data", None)
_KEYS = (
    tuple(os.environ.encodekey(var) for var in _VARS)
    if _DATA is not None and hasattr(os.environ, "encodekey")
    else None
)


def _snapshot() -> tuple:
    """Our variables' raw values. current() runs on every ring call: reading `_data` directly
    is ~20x cheaper than os.environ.get, which encodes the key and decodes the value."""
    if _KEYS is None:
        return tuple(os.environ.get(var) for var in _VARS)
    return tuple([_DATA.get(key) for key in _KEYS])


def current() -> RingConfig:
    """The configuration the environment gives now (re-parsed only when it changed)."""
    snapshot = _snapshot()
    if snapshot != _cache[0]:
        _cache[1] = RingConfig.from_env()
        _cache[0] = snapshot
    return _cache[1]


def env_table_markdown() -> str:
    """README's table of environment variables."""
    rows = ["| variable | default | effect |", "|---|---|---|"]
    for var, default, meaning in ENV.values():
        rows.append(f"| `{var}` | {f'`{default}`' if default else 'unset'} | {meaning} |")
    return "\n".join(rows) + "\n"
