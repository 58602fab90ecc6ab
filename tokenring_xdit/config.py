"""How TokenRing is configured: one frozen object, and the only reader of TOKENRING_XDIT_*.

Every setting comes from the environment (torchrun's workers inherit the launcher's), read here
and nowhere else; `current()` re-reads it only when one of our variables changed, so code that
sets `os.environ[...]` in-process (examples, benchmarks) is honoured without a per-call parse.
Python callers can pass a `RingConfig` to `token_ring_attn(config=...)` instead (a planner's
output, a test's). The `.pth` bootstrap reads TOKENRING_XDIT_AUTOPATCH (and STRICT) itself: it
runs in every interpreter and must not import even this module, so those two are declared in
_envflags.py, which both read.

Each setting has a scope, the code it is passed to (nothing below an entry point reads the
environment): CALL (one ring call), COMM (how a ring's communicators are made: `CommSettings`,
`RingConfig.comm`, passed through the agreement to communicator creation), HOST (a host's ring
choice) and PATCHING (the patch hooks). Entry points (token_ring_attn, the host adapters, the
patch hooks, setup_token_ring_group) call `current()` when they are given no config.

Each field names its parser (a typed function per kind of value); a value outside the allowed
set is a ValueError naming the allowed ones (booleans take 1/0, true/false, yes/no, on/off).
Settings that decide what a call does (final pieces, CUDA graphs, validate mode, the ring choice
and what `auto` decides from) are agreed across the ring before any transfer (ring/agree/);
ranks that differ fail together with one clear error.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, get_args

from ._envflags import AUTOPATCH, ENV_PREFIX, STRICT, misspelled, parse_flag
from .caches import Seen

__all__ = ["RingConfig", "CommSettings", "ENV", "current", "scope_of"]


RingImpl = Literal["default", "token_ring", "auto"]
Fabric = Literal["nvswitch", "nvlink-pair", "pcie", "p2p-off", "ib"]  # planner/fabric.py's links
ValidateMode = Literal["auto", "always", "signature"]
Transport = Literal["nccl", "ipc", "auto"]
RING_IMPLS: tuple[str, ...] = get_args(RingImpl)
FABRICS: tuple[str, ...] = get_args(Fabric)
VALIDATE_MODES: tuple[str, ...] = get_args(ValidateMode)
TRANSPORTS: tuple[str, ...] = get_args(Transport)
FABRIC_ALIASES = {"nvlink": "nvswitch", "p2p_off": "p2p-off", "infiniband": "ib"}
# where a host's ring choice came from, weakest first (hosts/selection.py; the agreement's codes)
RING_IMPL_SOURCES = (
    "default",
    "set_xdit_ring_impl()",
    "--ring_impl_type",
    ENV_PREFIX + "RING_IMPL",
)
# Not ours, but it changes the links `auto` predicts with; read here like our own variables.
NCCL_P2P_DISABLE = "NCCL_P2P_DISABLE"
# Not ours either: CUDA graphs of NCCL transfers hang with torch's expandable segments unless
# NCCL's graph buffer registration is off (pytorch#158029; measured on 4 x H200: a graphed
# ring replay never finished at call 100 of a soak; with NCCL_GRAPH_REGISTER=0, 10^4 calls ran)
ALLOC_CONF = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
NCCL_GRAPH_REGISTER = "NCCL_GRAPH_REGISTER"


def torchrun_attempt(environ=None) -> str:
    """Which of torchrun's attempts this worker is ("0" outside torchrun): its store outlives a
    restarted worker group, so keys written in it must name the attempt."""
    return (os.environ if environ is None else environ).get("TORCHELASTIC_RESTART_COUNT", "0")


def torchrun_restarted_with_shared_store(environ=None) -> bool:
    """A restarted torchrun worker whose store is the rendezvous's own (kept across restarts):
    torch can hand it the previous attempt's addresses (pytorch/pytorch#135712)."""
    environ = os.environ if environ is None else environ
    return (
        torchrun_attempt(environ) != "0" and environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    )


def graph_register_hazard(environ) -> bool:
    """Whether the allocator's expandable segments meet NCCL's graph buffer registration."""
    conf = ",".join(environ.get(var) or "" for var in ALLOC_CONF).replace(" ", "").lower()
    return "expandable_segments:true" in conf and environ.get(NCCL_GRAPH_REGISTER) != "0"


HEAD_START_MAX_US = 1000.0  # comm_head_start_us's bound (environment and RingConfig alike)


# Where a setting is used: each scope's code gets it passed, never reads it itself.
CALL = "call"  # one ring call (token_ring_attn's entry reads it, or its config=)
COMM = "communicator"  # a ring's communicators, when they are made (CommSettings)
HOST = "host"  # a host's ring choice: xDiT's and diffusers' adapters (hosts/)
PATCHING = "patching"  # the patch hooks (patches/)

Parser = Callable[[str | None, str, Any], Any]  # (raw text, variable, default) -> value


def _setting(name: str, default, doc: str, parse: Parser, scope: str = CALL) -> Any:
    """A field read from TOKENRING_XDIT_<name>: its default, its meaning (README's table), how
    its text is parsed (a parser per field, below) and the scope that uses it."""
    meta = {"env": ENV_PREFIX + name, "doc": doc, "parse": parse, "scope": scope}
    return dataclasses.field(default=default, metadata=meta)


# --- one parser per kind of field: (raw text or None, variable, default) -> value -------------


def _flag(raw: str | None, var: str, default: bool) -> bool:
    return parse_flag(raw, default, var)  # the start-up hook parses AUTOPATCH/STRICT the same


def _flag_or_auto(raw: str | None, var: str, default: bool | None) -> bool | None:
    """A flag, or None for `auto` (and unset: the default)."""
    if raw is None or raw.strip().lower() in ("", "auto"):
        return default
    return parse_flag(raw, default, var)


# Training calls replay as CUDA graphs by default where every rank holds at most this many
# queries: at 4k tokens per GPU graphs took 13-33 % off a ring-4 call, at 8k they cost 1.4-1.5 %
# (4 x H200, docs/performance.md, "training CUDA graphs")
AUTO_GRAPH_TOKENS = 4096


def _choice(allowed: tuple[str, ...], lower: bool = True, aliases: dict | None = None) -> Parser:
    """One of `allowed` (or an alias of one); the default when unset."""

    def parse(raw: str | None, var: str, default):
        text = (raw or "").strip()
        text = text.lower() if lower else text
        if not text:
            return default
        names = allowed + tuple(aliases or ())
        if text not in names:
            raise ValueError(f"{var}={raw!r}: use one of {', '.join(names)}")
        return (aliases or {}).get(text, text)

    return parse


def _fabric(raw: str | None, var: str, default):
    """A fabric name (or alias); or a measured link the planner reads itself: a given link
    "gbps=G[,latency_us=L][,both_ways_gbps=B]" or the path of a link probe's JSON
    (planner/fabric.py `fabric`; docs/multi-node.md)."""
    text = (raw or "").strip()
    if text.startswith("gbps=") or text.endswith(".json"):
        return text
    return _choice(FABRICS, aliases=FABRIC_ALIASES)(raw, var, default)


def _number(ok: Callable[[float], bool], allowed: str, auto: bool = False) -> Parser:
    """A number for which ok(number) holds (`auto` too, as None, when auto=True); the default
    when unset; ValueError naming what is allowed."""

    def parse(raw: str | None, var: str, default):
        if raw is None or not raw.strip():
            return default
        if auto and raw.strip().lower() == "auto":
            return None
        try:
            value = float(raw)
        except ValueError:
            value = float("nan")  # fails every `ok`
        if not ok(value):
            raise ValueError(f"{var}={raw!r}: use {allowed}")
        return value

    return parse


def _positive_or_invalid(raw: str | None, var: str, default: int) -> int:
    """A positive integer; -1 for anything else, so the call's agreement rejects it on every
    rank (ranks that disagree fail together instead of one raising alone)."""
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        return -1
    return value if value >= 1 else -1


_seconds = _number(lambda x: 0 < x < float("inf"), "a positive number of seconds")
_microseconds = _number(lambda x: 0 <= x <= HEAD_START_MAX_US,
                        f"0 to {HEAD_START_MAX_US:.0f} microseconds")  # fmt: skip
_fraction_or_auto = _number(
    lambda x: 0 <= x < 1, "`auto` or a number from 0 up to (not incl.) 1", auto=True
)


@dataclass(frozen=True)
class RingConfig:
    """Every TokenRing setting: each field's default, allowed values (its Literal) and meaning
    (its metadata["doc"]) are written here once; ENV, README's table and from_env() derive from
    them. TOKENRING_XDIT_AUTOPATCH is the bootstrap's alone (_envflags.AUTOPATCH)."""

    ring_impl: RingImpl | None = _setting(
        "RING_IMPL",
        None,
        "`token_ring`, `default` or `auto` (per call, from the planner's model): the ring xDiT "
        "and diffusers run, like `--ring_impl_type`",
        _choice(RING_IMPLS, lower=False),  # the ring's names are exact, like the flag's
        HOST,
    )  # None: not chosen by the environment
    fabric: Fabric | str | None = _setting(
        "FABRIC",
        None,
        "the links `auto` predicts with (`nvswitch`, `nvlink-pair`, `pcie`, `p2p-off`, `ib`, a "
        "measured link `gbps=G[,latency_us=L]` or a link probe's JSON path); unset: `p2p-off` "
        "if `NCCL_P2P_DISABLE=1`, else `nvswitch`",
        _fabric,
        HOST,
    )  # None: `auto` derives it (auto_fabric)
    cuda_graphs: bool = _setting(
        "CUDA_GRAPHS",
        True,
        "`0`: run each ring call eagerly instead of replaying a CUDA graph per input signature",
        _flag,
    )
    cuda_graph_transformer: bool = _setting(
        "CUDA_GRAPH_TRANSFORMER",
        False,
        "`1`: replay xDiT's whole transformer forward as a CUDA graph per step",
        _flag,
        HOST,
    )
    fused_merge: bool = _setting(
        "FUSED_MERGE",
        True,
        "`0`: merge partials with torch ops instead of the Triton pass inside graphs",
        _flag,
    )
    # -1 marks an invalid environment value: the input check rejects it on every rank, so ranks
    # that disagree fail together instead of one raising alone.
    final_chunks: int = _setting(
        "FINAL_CHUNKS",
        1,
        "pieces of the last partial's return (2 was faster only for Flux 1024 px at ring 2)",
        _positive_or_invalid,
    )
    comm_high_priority: bool = _setting(
        "COMM_HIGH_PRIORITY",
        False,
        "`1`: make the ring's NCCL communicators with high-priority streams (measured no gain at "
        "ring 2 over NVLink); read when a ring's communicators are made",
        _flag,
        COMM,
    )
    # Local to each rank (the own block never travels, so ranks need not agree on it).
    defer_own: float | None = _setting(
        "DEFER_OWN",
        None,
        "fraction of a rank's own queries whose block against its own K/V runs last, so the last "
        "partial's return travels behind it (0: the own block runs whole at step 0); unset or "
        "`auto`: 0.5 where a rank holds >= 8192 queries, 0.25 from 2048, else 0 (measured at "
        "ring 2 on H200)",
        _fraction_or_auto,
    )
    # Local to each rank (the own block never travels, so ranks need not agree on it).
    train_hold_back: bool = _setting(
        "TRAIN_HOLD_BACK",
        False,
        "`1`: training (and causal) calls run each rank's own block (step 0) on half of its "
        "K/V heads after posting the last return, so that transfer travels behind it in the "
        "forward and the backward; same results (ring/training/hold_back.py; not with packed "
        "documents or one K/V head)",
        _flag,
    )
    # Agreed across the ring (the header's CUDA-graphs field): a capture is collective.
    train_cuda_graph: bool | None = _setting(
        "TRAIN_CUDA_GRAPH",
        None,
        "`1`: training (and causal) calls replay their forward and their backward as one CUDA "
        "graph each per input signature (after one eager call and a capture), instead of "
        "launching every step's kernels and transfers; same results (ring/training/run.py; a "
        "call's `cuda_graph=` overrides it); `0`: never; unset or `auto`: where every rank holds "
        f"<= {AUTO_GRAPH_TOKENS} queries. Ring 4 on H200: at 4k tokens per GPU 13-33 % faster "
        "(causal GQA 9.07 -> 6.05 ms), at 8k per GPU 1.4-1.5 % slower",
        _flag_or_auto,
    )
    # Local to each rank (a pause on its own stream; nothing travels differently).
    comm_head_start_us: float = _setting(
        "COMM_HEAD_START_US",
        10.0,
        "microseconds the compute stream pauses after posting a partial that its last kernel "
        "made, so NCCL's transfer kernel gets SMs before the next attention kernel takes them "
        "all (NCCL transport, before blocks of >= 1e10 FLOP only; 0: never). On H200: 1-4 % "
        "faster calls at ring 2 from 16k tokens, up to 8 % at ring 4",
        _microseconds,
    )
    replay_step_marks: bool = _setting(
        "REPLAY_STEP_MARKS",
        False,
        "`1`: a CUDA-graph replay that misses the ring's deadline names the step it stopped at "
        "(each step's wait records an event inside the graph; measured 3-20 % slower graphed "
        "calls at ring 4 on H200, most at 4k tokens); `0`: its error names the peers only. Read "
        "when a ring's communicators are made",
        _flag,
        COMM,
    )
    validate: ValidateMode = _setting(
        "VALIDATE",
        "auto",
        "when ranks exchange the input check: `always` (every call), `signature` (new input "
        "signatures only), `auto` (always on gloo, signature on NCCL)",
        _choice(VALIDATE_MODES),
    )
    strict: bool = _setting(STRICT[0].removeprefix(ENV_PREFIX), *STRICT[1:], _flag, PATCHING)
    timeout: float | None = _setting(
        "TIMEOUT",
        None,
        "seconds any TokenRing wait may take before it raises `TokenRingCommError`; unset: the "
        "smaller of the ring group's and the world group's timeouts (read when a ring's "
        "communicators are made); `token_ring_attn(config=RingConfig(timeout=...))` sets one "
        "call's",
        _seconds,
        COMM,  # and per call: a call's config= gives that call's deadline
    )
    transport: Transport = _setting(
        "TRANSPORT",
        "nccl",
        "how ring ranks move data: `nccl` (the group's torch.distributed backend: NCCL, or gloo "
        "for CPU tensors), `ipc` (CUDA IPC copies into the peer's memory: several ranks on one "
        "GPU, or GPUs that can access each other; needs `cuda-bindings`), `auto` (`ipc` when "
        "ranks share a GPU or CUDA tensors meet a gloo group, else `nccl`)",
        _choice(TRANSPORTS),
    )  # agreed across the ring by the input check (ring/agree/)
    nccl_p2p_disabled: bool = False  # NCCL_P2P_DISABLE (not ours; `auto`'s fabric)
    # expandable segments with NCCL's graph registration on (not ours): ring graphs stay eager
    graph_register_hazard: bool = False

    @classmethod
    def from_env(cls, environ: os._Environ | dict | None = None) -> RingConfig:
        """The environment's settings; ValueError naming the allowed values for a bad one."""
        environ = os.environ if environ is None else environ
        _warn_misspelled(environ)
        values = {
            f.name: f.metadata["parse"](environ.get(f.metadata["env"]), f.metadata["env"],
                                        f.default)
            for f in _SETTINGS
        }  # fmt: skip
        p2p = _flag(environ.get(NCCL_P2P_DISABLE), NCCL_P2P_DISABLE, False)
        hazard = graph_register_hazard(environ)
        return cls(**values, nccl_p2p_disabled=p2p, graph_register_hazard=hazard)

    def __post_init__(self) -> None:
        if self.defer_own is not None and not 0 <= self.defer_own < 1:  # where it is built
            raise ValueError(f"RingConfig.defer_own={self.defer_own!r}: use 0 <= defer_own < 1")
        if not 0 <= self.comm_head_start_us <= HEAD_START_MAX_US:
            raise ValueError(
                f"RingConfig.comm_head_start_us={self.comm_head_start_us!r}: use 0 to "
                f"{HEAD_START_MAX_US:.0f}"
            )

    def replace(self, **changes) -> RingConfig:
        return dataclasses.replace(self, **changes)

    @functools.cached_property
    def comm(self) -> CommSettings:
        """The communicator-scope settings (what ring/comm is passed when it makes a ring's
        communicators). Made once per config: every call passes it, few calls make a ring."""
        return CommSettings(self.comm_high_priority, self.timeout, self.replay_step_marks)

    def auto_fabric(self) -> str:
        """The fabric `auto` predicts with: from the environment only (cheap, and the same on
        every rank, which inherits the launcher's), never from probing the links."""
        if self.fabric:
            return self.fabric
        # NCCL then stages every transfer through host memory: the planner's "p2p-off" links
        return "p2p-off" if self.nccl_p2p_disabled else "nvswitch"


@dataclass(frozen=True)
class CommSettings:
    """How a ring's communicators are made: read once, by the call (or set-up) that makes them;
    later calls share them whatever they pass (their `timeout` still bounds their own waits)."""

    high_priority: bool = False  # NCCL lanes on high-priority streams
    timeout: float | None = None  # the ring's deadline (s); None: its groups' own timeouts
    replay_step_marks: bool = False  # graph replays record an event per step (step_marks.py)


def scope_of(field: str) -> str:
    """The scope (CALL, COMM, HOST or PATCHING) whose code is passed `field`."""
    return _SCOPE[field]


def _warn_misspelled(environ) -> None:
    """A TOKENRING_XDIT_* variable we don't know is a typo: say so once, with the closest name."""
    for name, close in misspelled(list(environ), ENV_PREFIX, _VARS):
        if not _SEEN.warned.first(name):
            continue
        hint = f"did you mean {close}?" if close else f"valid names: {', '.join(_VARS[:-1])}"
        warnings.warn(
            f"{name} is not a tokenring_xdit setting and is ignored; {hint}", stacklevel=4
        )


_SETTINGS = tuple(f for f in dataclasses.fields(RingConfig) if "env" in f.metadata)
_SCOPE = {f.name: f.metadata["scope"] for f in _SETTINGS}


def _default_text(default) -> str:
    if default is None:
        return ""
    if isinstance(default, bool):
        return "1" if default else "0"
    return str(default)


# field -> (environment variable, default text, one-line meaning): README's table comes from here
ENV: dict[str, tuple[str, str, str]] = {
    **{f.name: (f.metadata["env"], _default_text(f.default), f.metadata["doc"])
       for f in _SETTINGS},
    "autopatch": (AUTOPATCH[0], _default_text(AUTOPATCH[1]), AUTOPATCH[2]),  # the bootstrap's
}  # fmt: skip
_VARS = (*(var for var, _, _ in ENV.values()), NCCL_P2P_DISABLE, *ALLOC_CONF, NCCL_GRAPH_REGISTER)


class _Parse(NamedTuple):
    """One parse of the environment: its size, the (variable, value) of ours that were set, and
    the configuration they gave."""

    size: int
    known: tuple[tuple[str, str], ...]
    config: RingConfig | None


class _EnvironmentSeen:
    """What this module remembers of the environment: its last parse (replaced whole: a thread
    never sees half of one) and the misspelled names warned about (the last 64). clear(): the
    next `current()` parses and warns again."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.last, self.warned = _Parse(-1, (), None), Seen(64)


_SEEN = _EnvironmentSeen()


def current() -> RingConfig:
    """The configuration the environment gives now, re-parsed only when it changed.

    Every TokenRing call asks, so the check is cheap (about 0.1 us plus one read per variable
    of ours that is set; reading all of ours cost 15 us, measurable on small graphed calls):
    the environment's size, then the values of ours that were set. Setting, changing or
    removing one of ours is seen; setting one of ours while removing another variable between
    two calls (the size unchanged) is not: set the environment before the calls, or pass
    `config=`.
    """
    environ, last = os.environ, _SEEN.last
    if len(environ) == last.size and all(environ.get(var) == x for var, x in last.known):
        return last.config
    values = [(var, environ.get(var)) for var in _VARS]
    cfg = RingConfig.from_env()
    _SEEN.last = _Parse(len(environ), tuple((v, x) for v, x in values if x is not None), cfg)
    return cfg


def env_table_markdown() -> str:
    """README's table of environment variables."""
    rows = ["| variable | default | effect |", "|---|---|---|"]
    for var, default, meaning in ENV.values():
        rows.append(f"| `{var}` | {f'`{default}`' if default else 'unset'} | {meaning} |")
    return "\n".join(rows) + "\n"
