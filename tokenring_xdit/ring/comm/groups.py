"""A ring's extra communicators: made once per ring group by its members, torn down in order.

TokenRing's return lane needs a second communicator of the ring's ranks (both lanes then run at
once; on NCCL on separate streams); on NCCL the Q lane gets one of its own too, and every ring
gets a CPU (gloo) communicator for the input check and the host's ring choice, so checks never
synchronise the GPU and never share a group with the host's own collectives (a gloo group that
met two differently sized all-gathers would abort the process). They are made the first time a
ring is used (or by `setup_token_ring_group`), by the ring's members only
(`use_local_synchronization`), so any group works.

The ring's deadline bounds every wait: TOKENRING_XDIT_TIMEOUT when set, else the smaller of the
ring group's and the world group's timeouts (groups made without one, like yunchang's, carry
torch's 30-minute default; the world's is the one a user sets in init_process_group). NCCL lane
communicators get twice that, so our own deadline (comm/watchdog.py) always fires before torch's
watchdog would abort the process. After a failure the ring is marked unusable: later calls say
so instead of failing in a misleading way. `release_ring_comms()` destroys them, newest first;
it runs at interpreter exit and before `destroy_process_group` (patches/torch_dist.py, put in
place before the first communicator is made).

Teardown and exit. Nothing of ours may keep a process group alive past `destroy_process_group`:
torch frees a group's gloo threads only when its last reference goes, and a gloo worker thread
that outlives the start of interpreter finalisation and then drops the last reference to a
finished collective (whose tensors own Python objects) needs the GIL, is killed by Python, and
the process aborts ("terminate called without an active exception"). So releasing a ring also
empties the per-group caches (RELEASE_HOOKS). At exit, in a program that made ring
communicators, a gloo default group it did not destroy is destroyed here, while the interpreter
is whole (the same race exists in plain torch:
about 2 runs in 15 of a program whose last call is a gloo all_gather). Our own NCCL
communicators are aborted, not finalised: an abort is local and bounded, a finalise can wait
on peers (pytorch/pytorch#119797); our queued kernels are waited for first, bounded by the
deadline.
"""

from __future__ import annotations

import atexit
import dataclasses
import gc
import hashlib
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ...config import current
from .errors import TokenRingCommError

__all__ = [
    "RingPosition",
    "RingComms",
    "comms_of",
    "setup_token_ring_group",
    "release_ring_comms",
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


def ring_deadline(group: dist.ProcessGroup) -> timedelta:
    """How long any wait of this ring may take (see the module docstring)."""
    configured = current().timeout
    if configured is not None:
        return timedelta(seconds=configured)
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
    failed: str | None = None  # why the ring is unusable (set by the first failure)
    base: RingComms | None = None  # a per-call view's ring (it shares the failure mark)

    def fail(self, why: str) -> None:
        if self.failed is None:
            self.failed = why
        if self.base is not None:
            self.base.fail(why)

    def ensure_usable(self) -> None:
        failed = self.failed if self.base is None else (self.base.failed or self.failed)
        if failed is not None:
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
        views = _VIEWS.setdefault(base, {})
        view = views.get(seconds)
        if view is None:
            view = views[seconds] = dataclasses.replace(
                base, deadline=timedelta(seconds=seconds), failed=None, base=base
            )
        return view

    def owned(self) -> list[dist.ProcessGroup]:
        """The communicators we made (not the caller's group)."""
        return [g for g in dict.fromkeys((self.q, self.out, self.check)) if g is not self.group]


_MADE: list[bool] = []  # non-empty once this process made ring communicators (the exit hook)
# ring group -> its communicators; weak keys, so a destroyed group's entry cannot be found
# again by a new group that reuses its name
_COMMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# ring -> {seconds: its view with that deadline}; released with the ring
_VIEWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def comms_of(group: dist.ProcessGroup) -> RingComms:
    """The communicators of `group`, made on first use by the ring's members."""
    comms = _COMMS.get(group)
    if comms is None:
        comms = _COMMS[group] = _make(group)
    return comms


def _make(group: dist.ProcessGroup) -> RingComms:
    from ..graphs import install_guards  # the destroy_process_group guard, before any comm

    install_guards()
    if not _MADE:
        _MADE.append(True)
    ranks = tuple(dist.get_process_group_ranks(group))
    backend = dist.get_backend(group)
    deadline = ring_deadline(group)
    # NCCL: torch's watchdog aborts the process at a communicator's timeout; ours must come first
    lane_timeout = deadline if backend == "gloo" else deadline * 2 + timedelta(seconds=10)

    def new(kind: str, timeout: timedelta) -> dist.ProcessGroup:
        # members only, same order on each: never involves ranks outside this ring
        return dist.new_group(
            list(ranks), timeout=timeout, backend=kind, use_local_synchronization=True,
            pg_options=_lane_options(kind),
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
        ) from exc
    name = int.from_bytes(hashlib.sha256(group.group_name.encode()).digest()[:7], "little")
    return RingComms(group, ranks, q, out, check, deadline, backend, name)


# ring ranks -> how many times this process made communicators for those ranks. Keyed like the
# communicators torch then makes (by member ranks, in order of creation), not by the group's
# name: ranks that passed different groups of the same ranks must still meet, so the input
# check can name the mismatch; a ring made again must not meet its predecessor's keys.
_ARRIVALS: dict[tuple[int, ...], int] = {}
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
    generation = _ARRIVALS.get(ranks, 0)
    _ARRIVALS[ranks] = generation + 1
    prefix = f"tokenring/arrive/{'-'.join(map(str, ranks))}/{generation}"
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


def _lane_options(kind: str):
    """NCCL lanes on high-priority streams when config.comm_high_priority asks: the block
    scheduler then gives their kernels SMs as the attention kernel's blocks retire. Off by
    default: no gain measured at ring 2 over NVLink (docs/performance.md)."""
    if kind != "nccl" or not current().comm_high_priority:
        return None
    options = dist.ProcessGroupNCCL.Options()
    options.is_high_priority_stream = True
    return options


def setup_token_ring_group(group: dist.ProcessGroup | None) -> None:
    """Create the extra communicators of `group` now instead of at its first TokenRing call.

    Optional: a ring call creates them itself. Called by the ring's members only; `group=None`
    means the default (world) group, as in TokenRing calls; idempotent. Without
    torch.distributed initialised there is nothing to set up: it raises.
    """
    if not dist.is_initialized():
        raise ValueError(
            "setup_token_ring_group: torch.distributed is not initialized; call "
            "init_process_group first (or skip set-up: TokenRing makes its communicators itself)"
        )
    group = group if group is not None else dist.group.WORLD
    if dist.get_world_size(group) > 1:
        comms_of(group)


def describe_peer(comms: RingComms, rank: int) -> str:
    return f"ring rank {rank} (global rank {comms.ranks[rank]})"


# --- teardown --------------------------------------------------------------------------------


# Called with the released ring's group (None: every ring) after release_ring_comms drops rings:
# modules that keep per-group state (the checks' signature cache, a pending backward's ring)
# forget it, so nothing of ours keeps a destroyed group alive.
RELEASE_HOOKS: list[Callable[[dist.ProcessGroup | None], None]] = []


def release_ring_comms(group: dist.ProcessGroup | None = None) -> None:
    """Destroy the communicators TokenRing made (for `group`'s ring, or every ring's), newest
    first, while torch.distributed is still whole. Safe to call twice; rings made again later
    get fresh communicators."""
    if not dist.is_initialized():
        _COMMS.clear()
        _VIEWS.clear()
        _forget(group)
        return
    for ring in reversed(list(_COMMS.keys())):
        if group is not None and ring is not group:
            continue
        comms = _COMMS.pop(ring, None)
        if comms is not None:
            _VIEWS.pop(comms, None)
            _tear_down(comms)
    _forget(group)


def _forget(group: dist.ProcessGroup | None) -> None:
    for hook in RELEASE_HOOKS:
        hook(group)


def _tear_down(comms: RingComms) -> None:
    """Gloo communicators are destroyed (local, instant); NCCL ones aborted together after our
    queued kernels finish or the deadline passes (an abort never waits on a peer)."""
    owned = list(reversed(comms.owned()))
    nccl = [g for g in owned if comms.backend == "nccl" and g is not comms.check]
    if nccl:
        _drain(comms.deadline)
    for g in owned:
        if g in nccl:
            continue
        try:
            dist.destroy_process_group(g)
        except (RuntimeError, ValueError):
            pass  # already destroyed with the world group
    if nccl:
        abort_together(nccl)


def _drain(deadline: timedelta) -> None:
    """Wait (polling, bounded) for the work queued so far on the current CUDA stream."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return
    event = torch.cuda.Event()
    event.record()
    end = time.monotonic() + deadline.total_seconds()
    while not event.query() and time.monotonic() < end:
        time.sleep(0.001)


def abort_together(groups: list[dist.ProcessGroup]) -> None:
    """Abort NCCL communicators inside one NCCL group call, as torch does for the world: aborts
    made one by one can wait on each other (pytorch/pytorch#119797)."""
    c10d = dist.distributed_c10d
    try:
        backend = groups[0]._get_backend(torch.device("cuda"))
        start, end = backend._group_start, backend._group_end
    except (AttributeError, RuntimeError):
        start = end = lambda: None  # noqa: E731
    start()
    try:
        for g in groups:
            try:
                c10d._abort_process_group(g)
            except (RuntimeError, ValueError, KeyError):
                # already destroyed with the world group, or aborted by the ring's deadline
                # (comm/watchdog.py): torch then no longer lists it (KeyError at exit, issue 44)
                pass
    finally:
        end()


def _at_exit() -> None:
    """Before interpreter finalisation: our communicators, then a gloo default group the
    program did not destroy (see the module docstring)."""
    from ..graphs import release_all_graphs

    release_all_graphs()  # a graph holding NCCL kernels keeps its communicator busy
    gc.collect()
    release_ring_comms()
    # only in programs that used a ring: one that never did keeps torch's own exit behaviour
    if _MADE and dist.is_initialized() and dist.get_backend() == "gloo":
        try:
            dist.destroy_process_group()
        except (RuntimeError, ValueError):
            pass


# At interpreter exit, before finalisation tears down gloo's threads in no particular order
# (registered after torch's import, so it runs before torch's own exit handlers).
atexit.register(_at_exit)
