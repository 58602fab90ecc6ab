"""Which ring xDiT (and diffusers' context parallelism) runs: its own, TokenRing, or `auto`.

Sources, strongest first: `set_xdit_ring_impl()` (Python), the `--ring_impl_type` flag of xDiT's
parsers (read when xFuserArgs.from_cli_args / from_runner_args runs, so in every torchrun worker),
the TOKENRING_XDIT_RING_IMPL environment variable (inherited by every worker), then "default".

`auto` decides per call signature (`AutoSignature`), from the planner's cost model
(`planner.choose`). Decisions are cached per signature.

Ranks must never disagree (one running TokenRing while its peer all-gathers K/V would hang or
abort both), so `choose` agrees the choice across the ring before either ring runs
(ring/agree/choice.py): each rank's choice, where it came from, and, under `auto`,
what it decides from besides the shapes (fabric, CUDA graphs, gradients); ranks that differ get
one ValueError on every rank, and `auto` then decides from the agreed longest lengths.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .. import config
from ..caches import Seen

RING_IMPL_ENV = config.ENV["ring_impl"][0]
# where a choice came from (the ring agreement sends their index: ring/agree/choice.py)
FROM_DEFAULT, FROM_PYTHON, FROM_FLAG, FROM_ENV = config.RING_IMPL_SOURCES
DEFAULT, TOKEN_RING, AUTO = config.RING_IMPLS


@dataclass
class _Chosen:
    """This process's ring choice from Python and from xDiT's flag (None: not chosen there), and
    its generation, bumped on every change: the agreement caches key on it, so the next call
    after a change exchanges again (NCCL rings otherwise reuse the last agreement for the same
    signature, and two ranks that each switched to a ring they had used before would both hit
    their caches and run different protocols)."""

    python: str | None = None
    flag: str | None = None
    generation: int = 0

    def set(self, **names: str | None) -> None:
        vars(self).update(names)
        self.generation += 1


CHOSEN = _Chosen()


def validate_ring_impl(name: str, source: str) -> str:
    if name not in config.RING_IMPLS:
        raise ValueError(
            f"unknown ring implementation {name!r} (from {source}); valid values: "
            f"{', '.join(config.RING_IMPLS)}"
        )
    return name


def set_xdit_ring_impl(name: str | None) -> None:
    """Choose xDiT's ring for this process ("token_ring", "default" or "auto"); None clears
    the choice."""
    CHOSEN.set(python=None if name is None else validate_ring_impl(name, "set_xdit_ring_impl"))


def set_from_flag(name: str | None) -> None:
    CHOSEN.set(flag=None if name is None else validate_ring_impl(name, "--ring_impl_type"))


def xdit_ring_impl(cfg: config.RingConfig | None = None) -> tuple[str, str]:
    """(implementation, where the choice came from); "auto" is resolved per call (decide).
    cfg: the host call's configuration (None: the environment's, read here)."""
    if CHOSEN.python:
        return CHOSEN.python, FROM_PYTHON
    if CHOSEN.flag:
        return CHOSEN.flag, FROM_FLAG
    env = (cfg or config.current()).ring_impl
    if env:
        return validate_ring_impl(env, RING_IMPL_ENV), FROM_ENV
    return DEFAULT, FROM_DEFAULT


def reset() -> None:
    CHOSEN.set(python=None, flag=None)


# --- what TokenRing refuses under a host ------------------------------------------------------

# (what `auto` calls it, whether this call has it, the error the host adapter raises for it, ""
# where another layer raises): each host lists its refusals once (hosts/xdit.py,
# hosts/diffusers.py); the patch passes their names to `auto` (which then keeps the host's
# ring), the adapter raises the first one's error.
Refusal = tuple[str, bool, str]


def refused_names(refusals: list[Refusal]) -> str:
    """The refused features of one call, for `auto` ("" when TokenRing can run it)."""
    return ", ".join(name for name, present, _ in refusals if present)


def raise_refused(refusals: list[Refusal]) -> None:
    """NotImplementedError for the first refused feature of the call (the same on every rank)."""
    for _, present, message in refusals:
        if present and message:
            raise NotImplementedError(message)


# --- auto ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AutoSignature:
    """One ring call as `auto` sees it. Lengths are tokens per ring rank (the max over the ring
    where shards may be uneven); heads are this rank's, after ulysses."""

    batch: int
    heads: int
    head_dim: int
    q_len: int
    kv_len: int
    ring: int
    dtype: str
    device_type: str
    device_name: str
    fabric: str
    graphs: bool
    refused: str = ""  # why TokenRing cannot run this call; "" when it can
    kv_heads: int = 0  # K/V heads under GQA/MQA (0: as many as query heads)


@dataclass(frozen=True)
class Decision:
    impl: str  # TOKEN_RING or DEFAULT
    why: str


def ring_call(
    tensor,
    batch: int,
    heads: int,
    head_dim: int,
    q_len: int,
    kv_len: int,
    ring: int,
    refused: str = "",
    kv_heads: int = 0,
    cfg: config.RingConfig | None = None,
) -> AutoSignature:
    """A call's signature: the shapes a host read, dtype and device from `tensor` (its query),
    fabric and graphs from the configuration (None: the environment's, read here)."""
    cfg = cfg or config.current()
    device_type = tensor.device.type
    return AutoSignature(
        batch=batch,
        heads=heads,
        head_dim=head_dim,
        q_len=q_len,
        kv_len=kv_len,
        ring=ring,
        dtype=str(tensor.dtype).removeprefix("torch."),
        device_type=device_type,
        device_name=_cuda_name(tensor.device.index) if device_type == "cuda" else device_type,
        fabric=cfg.auto_fabric(),
        graphs=cfg.cuda_graphs,
        refused=refused,
        kv_heads=kv_heads if kv_heads != heads else 0,
    )


@functools.cache
def _cuda_name(index: int | None) -> str:
    import torch

    return torch.cuda.get_device_name(index)


@functools.lru_cache(maxsize=1024)  # a function of the signature (and the planner's data)
def decide(call: AutoSignature) -> Decision:
    """`auto`'s choice for one call signature (cached: the planner runs once per signature)."""
    if call.refused:
        return Decision(DEFAULT, f"TokenRing does not run {call.refused}")
    if call.ring <= 1:
        return Decision(DEFAULT, "no ring")
    if call.device_type == "cpu":
        # gloo on CPU has no kernel table or link model; TokenRing is what CPU runs exist to test
        return Decision(TOKEN_RING, "cpu: no calibration to predict from, TokenRing by rule")
    if call.device_type != "cuda":
        return Decision(DEFAULT, f"{call.device_type}: no calibration, the host's ring by rule")
    from ..planner.choose import choose_ring, ring_times  # numpy/scipy: only when auto runs

    # batch counts as heads in the planner's kernel table (one kernel launch covers both)
    args = (
        call.batch * call.heads,
        call.head_dim,
        call.q_len,
        call.kv_len,
        call.ring,
        call.dtype,
        call.device_name,
        call.fabric,
        call.graphs,
        call.batch * call.kv_heads or None,  # GQA: the K/V ring moves g times fewer bytes
    )
    tr_ms, host_ms = ring_times(*args)
    mode = "graphed" if call.graphs else "eager"
    why = f"predicted {tr_ms:.3f} ms vs {host_ms:.3f} ms, {call.device_name}, {call.fabric}, {mode}"
    return Decision(choose_ring(*args), why)


def describe(call: AutoSignature, decision: Decision, host_ring: str) -> str:
    """The rank-0 log line of one decision."""
    what = "TokenRing" if decision.impl == TOKEN_RING else host_ring
    shape = f"{call.heads}x{call.head_dim}" + (f", batch {call.batch}" if call.batch > 1 else "")
    if call.kv_heads:
        shape += f", {call.kv_heads} K/V heads"
    tokens = f"{call.q_len * call.ring} tokens"
    if call.kv_len != call.q_len:
        tokens += f" (K/V {call.kv_len * call.ring})"
    return (
        f"ring attention: auto -> {what} for {shape}, {tokens}, ring {call.ring} ({decision.why})"
    )


def auto_inputs(cfg: config.RingConfig, grad: bool, dtype, device_type: str) -> tuple:
    """What `auto` decides from besides the shapes: agreed across the ring (as a digest) by
    both the eager and the traced choice, so the two cannot digest differently."""
    return (cfg.auto_fabric(), cfg.cuda_graphs, grad, dtype, device_type)


def choose(group, query, q_len: int, kv_len: int, signature, announce) -> str:
    """TOKEN_RING or DEFAULT for one host call, the same on every rank of the ring `group`.

    signature(q_len, kv_len) -> AutoSignature builds `auto`'s view from the agreed longest
    lengths; announce(impl, source, call, decision) logs once (call/decision None unless auto).
    """
    import torch

    from ..ring.agree import Choice, agree_ring_choice

    cfg = config.current()  # the host call's entry: read once, passed on
    impl, source = xdit_ring_impl(cfg)
    inputs = None
    if impl == AUTO:
        grad = torch.is_grad_enabled() and query.requires_grad
        inputs = auto_inputs(cfg, grad, query.dtype, query.device.type)
    lengths = agree_ring_choice(
        group, Choice.of(impl), source, inputs, (q_len, kv_len), query.device, cfg.validate,
        epoch=CHOSEN.generation, comm=cfg.comm,
    )  # fmt: skip
    if impl != AUTO:
        announce(impl, source, None, None)
        return impl
    call = signature(*lengths)
    decision = decide(call)
    announce(impl, source, call, decision)
    return decision.impl


def reset_decisions() -> None:
    decide.cache_clear()


def announced() -> Seen:
    """What a host's choice logs (`log_once`) have said: implementations and `auto`'s call
    signatures, the last 1024."""
    return Seen(1024)


def log_once(log, seen: Seen, key, message: str) -> None:
    """Log `message` at INFO on global rank 0 the first time `key` is seen in this process
    (every rank records the key, so a later rank-0 change of mind cannot happen silently)."""
    if not seen.first(key):
        return
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        log.info("%s", message)
