"""The ring's live communicators and their teardown, and the ring's own guard on
`torch.distributed.destroy_process_group`.

The guard: a CUDA graph that captured NCCL kernels keeps its communicator in use, and torch's
`destroy_process_group` then waits forever in ncclCommDestroy (pytorch/pytorch#115388; seen on
2 x H200 with torch 2.11; xDiT's scripts end with `destroy_distributed_env()`). So before a
group is destroyed, the guard drops every CUDA graph of ours (GRAPH_RELEASERS: ring/graph_cache.py
registers its caches) and tears down TokenRing's own ring communicators, newest first. The ring
puts it in place itself (`ensure_guard`), before it makes a ring's first communicators and
before its first graph capture, so a checkout on PYTHONPATH without install metadata gets it
too. The patch table lists it (row `torch.destroy_process_group`); patches/
torch_dist.py reports and reverts it, and `tokenring_xdit.uninstall()` gives torch its own
function back.

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
import functools
import gc
import threading
import time
import weakref
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = [
    "GRAPH_RELEASERS",
    "RELEASE_HOOKS",
    "ensure_guard",
    "guard_installed",
    "release_graphs",
    "release_ring_comms",
    "remove_guard",
]

_MADE: list[bool] = []  # non-empty once this process made ring communicators (the exit hook)
_FAILED: list[bool] = []  # non-empty once a ring of this process failed (a peer gone or stuck)
# ring group -> its communicators (groups.py fills it); weak keys, so a destroyed group's entry
# cannot be found again by a new group that reuses its name
_COMMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# ring -> {seconds: its view with that deadline}; released with the ring
_VIEWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Each drops every CUDA graph of one kind of cache and returns how many caches held any
# (ring/graph_cache.py registers its own when it is imported: no graph exists before that).
GRAPH_RELEASERS: list[Callable[[], int]] = []


# --- the guard -------------------------------------------------------------------------------


def release_graphs() -> None:
    """Drop every CUDA graph tokenring_xdit holds (TokenRing calls and graphed transformers)."""
    if sum(release() for release in GRAPH_RELEASERS):
        # a graph is destroyed with its last reference; collect only when graphs were dropped:
        # xDiT destroys a dozen groups at exit and a full collection each cost seconds there
        gc.collect()


def _guarded(destroy: Callable) -> Callable:
    @functools.wraps(destroy)
    def destroy_process_group(*args, **kwargs):
        release_graphs()
        group = args[0] if args else kwargs.get("group")
        release_ring_comms(group)  # ours first, newest first (None: every ring's)
        if group in (None, dist.GroupMember.WORLD) and _abort_instead():
            return _abort_every_group()
        return destroy(*args, **kwargs)

    return destroy_process_group


def _abort_instead() -> bool:
    """After a ring of this process failed on NCCL, ending every group aborts it instead of
    destroying it: torch's destroy finalises each NCCL communicator, which waits for its peers,
    and a peer that is alive but stopped never comes. Measured (2 x H200, a graph
    replay whose peer hung): destroy_process_group() still blocked 55 s after the error with
    the survivor's GPU idle; aborting every group took 0.5 s and the process exited 1.2 s after
    its error. (torch itself aborts a group it must end without a destroy, in its destructor.)"""
    return bool(_FAILED) and dist.is_initialized() and "nccl" in str(dist.get_backend()).lower()


def _abort_every_group() -> None:
    dist.distributed_c10d._abort_process_group()  # all at once (one NCCL group call)


_GUARD: dict[str, Callable] = {}  # "original", "guard" while installed


def ensure_guard() -> None:
    """Put the guard in place (idempotent): under both names torch exports it by."""
    if _GUARD:
        return
    c10d = dist.distributed_c10d
    original = c10d.destroy_process_group
    guard = _guarded(original)
    c10d.destroy_process_group = guard
    if dist.destroy_process_group is original:
        dist.destroy_process_group = guard
    _GUARD.update(original=original, guard=guard)


def guard_installed() -> bool:
    return bool(_GUARD)


def remove_guard() -> None:
    """Give torch its own destroy_process_group back (where ours is still in place)."""
    if not _GUARD:
        return
    release_graphs()  # the unguarded destroy_process_group would hang on them
    c10d = dist.distributed_c10d
    for owner in (c10d, dist):
        if owner.destroy_process_group is _GUARD["guard"]:
            owner.destroy_process_group = _GUARD["original"]
    _GUARD.clear()


def ring_failed() -> None:
    """Note that a ring of this process failed (the exit hook then destroys the groups)."""
    if not _FAILED:
        _FAILED.append(True)


def made_rings() -> None:
    """Note that this process made ring communicators (the exit hook acts only then)."""
    if not _MADE:
        _MADE.append(True)


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


def _tear_down(comms) -> None:  # a groups.RingComms
    """Gloo communicators are destroyed (local, instant); NCCL ones aborted together after our
    queued kernels finish or the deadline passes (an abort never waits on a peer). A ring that
    failed is not drained: its kernels may wait on a dead peer until the abort frees them."""
    owned = list(reversed(comms.owned()))
    nccl = [g for g in owned if comms.backend == "nccl" and g is not comms.check]
    if nccl and comms.failed is None:  # (a ring here is never a per-call view)
        _drain(comms.deadline)
    for g in owned:
        if g in nccl:
            continue
        try:
            dist.destroy_process_group(g)
        except (RuntimeError, ValueError):
            pass  # already destroyed with the world group
    if nccl:
        abort_together(nccl, comms.deadline.total_seconds())


def _drain(deadline: timedelta) -> None:
    """Wait (polling, bounded) for the work queued so far on the current CUDA stream."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return
    event = torch.cuda.Event()
    event.record()
    end = time.monotonic() + deadline.total_seconds()
    while not event.query() and time.monotonic() < end:
        time.sleep(0.001)


# Held while ring communicators are being aborted: teardown at exit (or destroy_process_group)
# waits for an abort the deadline's watchdog started, instead of racing it (a process that
# exits while an abort is half done dies in std::terminate, measured on 2 x H200).
_ABORTING = threading.Lock()
_ABORTED: weakref.WeakSet = weakref.WeakSet()  # groups whose abort already ran


def abort_together(
    groups: list[dist.ProcessGroup], timeout_s: float = 60.0, started: Callable | None = None
) -> list:
    """Abort NCCL communicators all at once, one thread each; returns those whose abort did
    not finish within `timeout_s` (they are left to torch). `started()` runs once the aborts
    are under way, before waiting for them.

    Why at once: an NCCL abort raises its communicator's abort flag and then waits for that
    communicator's queued GPU work, which can wait (through the compute stream) on ANOTHER
    communicator's stuck transfer. Aborted one after the other, the first abort waits on a
    kernel whose abort flag is only raised by the second: measured on 2 x H200, the
    first abort of an eager causal ring hung until torch's own timeout, then torch took the
    process down. One NCCL group call does not help: torch runs each abort on a thread of its
    own, outside the caller's group. In parallel every flag goes up at once and all stuck
    kernels quit.
    """
    groups = [g for g in groups if g not in _ABORTED]
    if not groups or not _ABORTING.acquire(timeout=timeout_s):
        if started is not None:
            started()  # the aborts are under way already (or done)
        return groups
    try:
        threads = [
            threading.Thread(target=_abort_one, args=(g,), name="tokenring-abort", daemon=True)
            for g in groups
        ]
        for t in threads:
            t.start()
        end = time.monotonic() + timeout_s
        if started is not None:
            started()
        for t in threads:
            t.join(max(end - time.monotonic(), 0.0))
        _ABORTED.update(groups)
        return [g for g, t in zip(groups, threads, strict=True) if t.is_alive()]
    finally:
        _ABORTING.release()


def wait_for_aborts(timeout_s: float) -> None:
    """Wait (bounded) until no abort of ring communicators is in flight."""
    if _ABORTING.acquire(timeout=timeout_s):
        _ABORTING.release()


def _abort_one(group: dist.ProcessGroup) -> None:
    try:
        dist.distributed_c10d._abort_process_group(group)
    except (RuntimeError, ValueError, KeyError):
        # already destroyed with the world group, or aborted before (torch no longer lists it)
        pass


def _at_exit() -> None:
    """Before interpreter finalisation: our communicators, then a gloo default group the
    program did not destroy (see the module docstring), or any default group once a ring
    failed (`_destroy_default_group`)."""
    release_graphs()  # a graph holding NCCL kernels keeps its communicator busy
    gc.collect()
    release_ring_comms()
    # only in programs that used a ring: one that never did keeps torch's own exit behaviour
    if _MADE and dist.is_initialized() and (dist.get_backend() == "gloo" or _FAILED):
        _destroy_default_group()


_EXIT_DESTROY_S = 30.0  # an NCCL destroy is local after the abort: 0.25-0.35 s measured


def _destroy_default_group() -> None:
    """End what the program left, bounded. After a ring failed on NCCL, a survivor that
    exited at once ended in std::terminate ("terminate called without an active exception")
    in torch's teardown of the groups left at interpreter finalisation: measured on 2 x H200,
    torch 2.11, 11 of 22 plain fault scenarios; destroying the groups first (0.3 s)
    or a 3 s pause made 4 of 4 exits clean each, and this hook 5 of 5. Aborted rather than
    destroyed there (`_abort_instead`): a destroy waited 30 s (this bound) for a stopped peer."""
    done = threading.Event()
    end = _abort_every_group if _abort_instead() else dist.destroy_process_group

    def destroy() -> None:
        try:
            end()
        except (RuntimeError, ValueError):
            pass
        done.set()

    threading.Thread(target=destroy, name="tokenring-exit", daemon=True).start()
    done.wait(_EXIT_DESTROY_S)


# At interpreter exit, before finalisation tears down gloo's threads in no particular order
# (registered after torch's import, so it runs before torch's own exit handlers).
atexit.register(_at_exit)
