"""A ring's extra communicators: made once per ring group by its members, torn down in order.

TokenRing's return lane needs a second communicator of the ring's ranks (both lanes then run at
once; on NCCL on separate streams); on NCCL the Q lane gets one of its own too, and every ring
gets a CPU (gloo) communicator for the input check and the host's ring choice, so checks never
synchronise the GPU and never share a group with the host's own collectives (a gloo group that
met two differently sized all-gathers would abort the process). They are made the first time a
ring is used (or by `setup_token_ring_group`), by the ring's members only
(`use_local_synchronization`), so any group works.

How they are made is the communicator scope of the configuration (`config.CommSettings`),
passed by the call or set-up that makes them: high-priority NCCL streams or not, and the
deadline. The ring's deadline bounds every wait: the settings' timeout
(TOKENRING_XDIT_TIMEOUT, or a call's RingConfig.timeout) when set, else the smaller of the
ring group's and the world group's timeouts (groups made without one, like yunchang's, carry
torch's 30-minute default; the world's is the one a user sets in init_process_group). NCCL lane
communicators get twice that, so our own deadline (comm/watchdog.py) always fires before torch's
watchdog would abort the process. After a failure the ring is marked unusable: later calls say
so instead of failing in a misleading way. Teardown (teardown.py): `release_ring_comms()`
destroys them, newest first, at interpreter exit and before `destroy_process_group`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from ...config import CommSettings, current, torchrun_attempt, torchrun_restarted_with_shared_store
from . import teardown
from .errors import TokenRingCommError
from .teardown import LIVE, release_ring_comms

__all__ = [
    "RingPosition",
    "RingComms",
    "comms_of",
    "setup_token_ring_group",
    "release_ring_comms",
    "ring_deadline",
    "group_timeout",
    "describe_peer",
]


@dataclass(frozen=True)
class RingPosition:
    """This process's place in a ring: the group (None without torch.distributed), its rank
    there and the ring size."""

    group: dist.ProcessGroup | None
    rank: int
    size: int

    @classmethod
    def of(cls, group: dist.ProcessGroup | None) -> RingPosition:
        if not dist.is_initialized():
            if group is not None:
                raise ValueError(
                    "TokenRing: a group was given but torch.distributed is not initialized"
                )
            return cls(None, 0, 1)
        group = group if group is not None else dist.group.WORLD  # None: the default group
        rank = dist.get_rank(group)
        if rank < 0:
            raise ValueError(
                f"TokenRing: global rank {dist.get_rank()} is not a member of the given group "
                f"(ranks {dist.get_process_group_ranks(group)}); pass this rank's own ring group"
            )
        return cls(group, rank, dist.get_world_size(group))


def group_timeout(group: dist.ProcessGroup) -> timedelta:
    """The timeout `group` was created with."""
    backend = dist.get_backend(group)
    device = torch.device("cuda" if backend == "nccl" else "cpu")
    try:
        return group._get_backend(device).options._timeout
    except (AttributeError, RuntimeError):
        return dist.distributed_c10d._get_default_timeout(backend)


def ring_deadline(group: dist.ProcessGroup, timeout: float | None) -> timedelta:
    """How long any wait of this ring may take: `timeout` seconds, or (None) the smaller of
    the ring group's and the world group's timeouts (see the module docstring)."""
    if timeout is not None:
        return timedelta(seconds=timeout)
    return min(group_timeout(group), group_timeout(dist.group.WORLD))


@dataclass(eq=False)
class RingComms:
    """What a ring needs besides its own group; one per ring group, shared by every call."""

    group: dist.ProcessGroup  # the ring (the caller's group)
    ranks: tuple[int, ...]  # ring rank -> global rank
    q: dist.ProcessGroup  # Q lane: the ring group itself on gloo, our own on NCCL
    out: dist.ProcessGroup  # returned partials
    check: dist.ProcessGroup  # CPU: input check and host ring choice
    deadline: timedelta
    backend: str
    name: int = 0  # digest of the ring group's name: equal on its ranks for one group
    settings: CommSettings = CommSettings()  # what they were made with
    failed: str | None = None  # why the ring is unusable (set by the first failure)
    base: RingComms | None = None  # a per-call view's ring (it shares the failure mark)
    # NCCL: (work, (lane, what, step, send peers, receive peers)) per lane wait of the eager
    # call in flight; the deadline's watchdog takes them with the call and names the first
    # step whose transfers never completed
    marks: list = field(default_factory=list, repr=False)
    # the same for CUDA-graph replays (comm/step_marks.py): the marks of the call being
    # captured, and each graph key's marks, which a replay of it takes as its own
    captured: list | None = field(default=None, repr=False)
    graph_marks: dict = field(default_factory=dict, repr=False)
    # lane group -> how it takes posts directly (comm/lanes.py), decided at its first post;
    # shared with the ring's per-call views, gone with the ring
    direct: dict = field(default_factory=dict, repr=False)

    def fail(self, why: str) -> None:
        teardown.ring_failed()
        if self.failed is None:
            self.failed = why
        if self.base is not None:
            self.base.fail(why)

    def ensure_usable(self) -> None:
        failed = self.failed if self.base is None else (self.base.failed or self.failed)
        if failed is not None:
            # an abort the deadline started finishes first: a caller that exits on this error
            # must not race it (std::terminate at exit, measured on graphed calls)
            teardown.wait_for_aborts(self.deadline.total_seconds())
            raise TokenRingCommError(
                f"TokenRing: the ring of global ranks {list(self.ranks)} is unusable after an "
                f"earlier failure ({failed[:400]}). Its communicators may hold half-done "
                "transfers; recover by ending the job or by destroying and re-creating the "
                "process groups (destroy_process_group, then init_process_group / new_group)"
            )

    def with_deadline(self, seconds: float) -> RingComms:
        """This ring with another deadline (a call's RingConfig.timeout): same communicators,
        same failure mark. On NCCL it is capped below our communicators' own timeout, so our
        watchdog still fires before torch's would abort the process."""
        base = self.base or self
        if base.backend != "gloo":
            seconds = min(seconds, 2 * base.deadline.total_seconds())
        views = LIVE.views.setdefault(base, {})
        view = views.get(seconds)
        if view is None:
            view = views[seconds] = dataclasses.replace(
                base, deadline=timedelta(seconds=seconds), failed=None, base=base
            )
        return view

    def owned(self) -> list[dist.ProcessGroup]:
        """The communicators we made (not the caller's group)."""
        return [g for g in dict.fromkeys((self.q, self.out, self.check)) if g is not self.group]


def comms_of(group: dist.ProcessGroup, settings: CommSettings | None = None) -> RingComms:
    """The communicators of `group`, made on first use by the ring's members with `settings`
    (None: the defaults); a ring made earlier is returned as it was made."""
    comms = LIVE.comms.get(group)
    if comms is None:
        comms = LIVE.comms[group] = _make(group, settings or CommSettings())
    return comms


def _make(group: dist.ProcessGroup, settings: CommSettings) -> RingComms:
    teardown.ensure_guard()  # destroy_process_group tears ours down first, on every backend
    teardown.made_rings()
    ranks = tuple(dist.get_process_group_ranks(group))
    backend = dist.get_backend(group)
    deadline = ring_deadline(group, settings.timeout)
    # NCCL: torch's watchdog aborts the process at a communicator's timeout; ours must come first
    lane_timeout = deadline if backend == "gloo" else deadline * 2 + timedelta(seconds=10)

    def new(kind: str, timeout: timedelta) -> dist.ProcessGroup:
        # members only, same order on each: never involves ranks outside this ring
        return dist.new_group(
            list(ranks), timeout=timeout, backend=kind, use_local_synchronization=True,
            pg_options=lane_options(kind, settings.high_priority),
        )  # fmt: skip

    try:
        _members_arrive(ranks, deadline)  # Ctrl-C works while a member is missing
        check = new("gloo", deadline)
        q = group if backend == "gloo" else new(backend, lane_timeout)
        out = new(backend, lane_timeout)
    except (RuntimeError, dist.DistError) as exc:
        raise TokenRingCommError(
            f"TokenRing could not create the communicators of the ring of global ranks "
            f"{list(ranks)} on global rank {dist.get_rank()} within "
            f"{deadline.total_seconds():.0f} s ({str(exc).strip().splitlines()[0][:200]}); "
            "likely causes: a member of the ring raised or exited, did not call TokenRing "
            "(or setup_token_ring_group) with this group, or passed a different group"
            + _restart_hint()
        ) from exc
    name = int.from_bytes(hashlib.sha256(group.group_name.encode()).digest()[:7], "little")
    return RingComms(group, ranks, q, out, check, deadline, backend, name, settings)


def _restart_hint() -> str:
    """Why making communicators can fail in a worker group torchrun restarted: its store, shared
    with the rendezvous, still holds the previous attempt's addresses, and torch's gloo and NCCL
    set-up can read those (measured, torch 2.11 and 2.13: even a plain gloo init_process_group
    of the restarted group fails with connection refused)."""
    if not torchrun_restarted_with_shared_store():
        return ""
    return (
        f"; this is torchrun's restart {torchrun_attempt()} and its store is shared with the "
        "rendezvous, where torch can hand the restarted workers the previous attempt's "
        "addresses (pytorch/pytorch#135712): launch with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
    )


_ARRIVAL_POLL_S = 0.05


def _members_arrive(ranks: tuple[int, ...], deadline: timedelta) -> None:
    """Wait, in Python, until every member of the ring has started making its communicators.

    Making a communicator blocks inside torch's C++ until every member joins, where neither
    Ctrl-C nor SIGTERM's Python handlers run; a missing member then held the process for the
    whole deadline (30 minutes by default on gloo). Each member posts a key in the default
    store and polls the others' (non-blocking checks, short sleeps, so signals are handled
    within a poll), so once the communicators are made every member is already there. The
    wait is bounded by the ring's deadline and names who is missing.
    """
    try:
        store = dist.distributed_c10d._get_default_store()
    except (RuntimeError, ValueError, AttributeError):
        return  # no store to meet on (a custom init): torch's own wait stays the only one
    # Keyed like the communicators torch then makes (by member ranks, in order of creation),
    # not by the group's name: ranks that passed different groups of the same ranks must still
    # meet, so the input check can name the mismatch; a ring made again must not meet its
    # predecessor's keys (the store outlives it: never cleared).
    generation = LIVE.arrivals.get(ranks, 0)
    LIVE.arrivals[ranks] = generation + 1
    # keyed by torchrun's attempt too: its store outlives a restarted worker group, whose
    # members would otherwise find their predecessors' keys and not wait for each other
    prefix = f"tokenring/arrive/{torchrun_attempt()}/{'-'.join(map(str, ranks))}/{generation}"
    store.set(f"{prefix}/{dist.get_rank()}", b"1")
    keys = {r: f"{prefix}/{r}" for r in ranks}
    end = time.monotonic() + deadline.total_seconds()
    while True:
        missing = [r for r, key in keys.items() if not store.check([key])]
        if not missing:
            return
        if time.monotonic() > end:
            raise RuntimeError(
                f"global ranks {missing} of the ring did not start TokenRing within the deadline"
            )
        time.sleep(_ARRIVAL_POLL_S)


def lane_options(kind: str, high_priority: bool):
    """NCCL lanes on high-priority streams when asked (CommSettings.high_priority): the block
    scheduler then gives their kernels SMs as the attention kernel's blocks retire. Off by
    default: no gain measured at ring 2 over NVLink (docs/performance.md)."""
    if kind != "nccl" or not high_priority:
        return None
    options = dist.ProcessGroupNCCL.Options()
    options.is_high_priority_stream = True
    return options


def setup_token_ring_group(
    group: dist.ProcessGroup | None, settings: CommSettings | None = None
) -> None:
    """Create the extra communicators of `group` now instead of at its first TokenRing call.

    Optional: a ring call creates them itself. Called by the ring's members only; `group=None`
    means the default (world) group, as in TokenRing calls; idempotent. `settings`: how to make
    them (a RingConfig's `.comm`); None: the environment's (this public entry point reads it).
    Without torch.distributed initialised there is nothing to set up: it raises.
    """
    if not dist.is_initialized():
        raise ValueError(
            "setup_token_ring_group: torch.distributed is not initialized; call "
            "init_process_group first (or skip set-up: TokenRing makes its communicators itself)"
        )
    group = group if group is not None else dist.group.WORLD
    if dist.get_world_size(group) > 1:
        comms_of(group, settings if settings is not None else current().comm)


def describe_peer(comms: RingComms, rank: int) -> str:
    return f"ring rank {rank} (global rank {comms.ranks[rank]})"
