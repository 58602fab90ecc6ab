"""agree(): one TokenRing call checked on every ring rank at once, before any transfer.

Every rank packs its header (header.py), the ring exchanges them (exchange.py), and every rank then
raises the same error or builds the same `Ring`, with a packed call's plan (its documents learnt,
from position ids through a second exchange of claims, and checked against the ring). When the
exchange runs is RingConfig.validate: "always" every call; "signature" only for an input signature
this rank has not seen (a peer whose shapes change alone then waits for us until the deadline and
both sides raise the named error); "auto" is "always" on gloo rings and "signature" on NCCL rings.
"""

from __future__ import annotations

from operator import attrgetter

import torch
import torch.distributed as dist

from ...config import CommSettings
from ..agreed_ring import Ring
from ..comm import RingComms, RingPosition, TokenRingCommError, comms_of
from ..comm.groups import describe_peer
from ..packed import Documents, call_plan, claim_count, documents_from_claims, local_claims
from ..split.value import KINDS, PLAIN, ZIGZAG
from ..tensor_layout import wire_swapped
from .choice import raise_choice
from .codes import DEVICE_TYPES, DTYPES, TRANSPORT_CODES, device_name
from .exchange import always, cached, exchange, remember
from .header import MUST_AGREE, Header, call_header, in_words
from .problems import CallSpec, Problem, local_problem

__all__ = ["agree"]

_Q_LEN, _KV_LEN = attrgetter("q_len"), attrgetter("train_kv_len")  # (C calls: a per-call path)


def _fast_key(spec: CallSpec, pos: RingPosition) -> tuple | None:
    """Everything a non-causal call's header is made of, read without building it (the cheap
    per-call path of the signature cache). Causal calls carry a proof to read each time."""
    if spec.causal or spec.packed:
        return None
    q, k, v, joint = spec.q, spec.k, spec.v, spec.joint_kv
    grad = spec.grad
    joint_sig = None if joint is None else tuple((x.shape, x.dtype, x.device) for x in joint)
    return (pos.group, spec.layout, spec.chunks, spec.scale, spec.kernel, spec.graphs,
            spec.validate, spec.transport, spec.problem, grad, joint_sig, q.shape, k.shape, v.shape,
            q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, spec.timeout,
            spec.split.code, spec.agreed)  # fmt: skip


def agree(spec: CallSpec, pos: RingPosition, *, comm: CommSettings | None = None) -> Ring:
    """Validate this call on every ring rank at once and return the agreed ring. `comm`: how
    the ring's communicators are made if this call makes them (a RingConfig's `.comm`)."""
    comms = comms_of(pos.group, comm) if pos.size > 1 else None
    if comms is not None:
        comms.ensure_usable()
        if spec.timeout is not None:  # this call's deadline: its lanes, watchdog and check
            comms = comms.with_deadline(spec.timeout)
    device_type = _ring_device_type(comms, spec)
    use_cache = comms is not None and not always(spec.validate, device_type)
    fast = _fast_key(spec, pos) if use_cache else None
    hit = cached(fast) if fast is not None else None
    if hit is not None:
        return hit
    header = _header(spec, pos, device_type)
    if comms is None:
        _raise_for([header], spec, device_type)  # a ring of one: its own words
        plan = _plan(None, 0, [header], spec)
        return Ring(pos=pos, comms=None, q_lens=(header.q_len,), settings=header.ring_settings(),
                    plan=plan, kv_lens=(header.train_kv_len,))  # fmt: skip
    key = (pos.group, header.cache_key(), spec.q.device, spec.timeout)
    use_cache = use_cache and spec.doc_positions is None  # their documents are new per call
    hit = cached(key) if use_cache and not header.problem else None
    if hit is None:
        hit = _exchanged(comms, header, spec, pos, device_type)
        remember(key, hit)
    if fast is not None:
        remember(fast, hit)
    return hit


def _header(spec: CallSpec, pos: RingPosition, device_type: str) -> Header:
    """This rank's header: its own problem with the call (found before any exchange: its
    split's too, `proof.call_split`), its claims of packed documents."""
    problem = local_problem(spec, device_type, DTYPES)
    claims = 0
    if not problem and spec.doc_positions is not None:
        claims = claim_count(
            spec.doc_positions, spec.q.shape[spec.layout.seq_dim], _chunks(spec, pos.size)
        )
        problem = Problem.POSITION_IDS if claims < 0 else Problem.NONE
    header = call_header(spec, problem)
    header.ndocs = max(header.ndocs, claims)
    return header


def _exchanged(
    comms: RingComms, header: Header, spec: CallSpec, pos: RingPosition, device_type: str
) -> Ring:
    """The ring every rank agrees on after exchanging headers (or the same error on each)."""
    headers = exchange(comms, pos.rank, header)
    _raise_for(headers, spec, device_type, comms)
    return Ring(
        pos=pos, comms=comms, q_lens=tuple(map(_Q_LEN, headers)),
        settings=headers[0].ring_settings(), transport=_resolve_transport(headers, comms.backend),
        plan=_plan(comms, pos.rank, headers, spec), swapped=wire_swapped([h.wire for h in headers]),
        kv_lens=tuple(map(_KV_LEN, headers)),
    )  # fmt: skip


def _raise_for(
    headers: list[Header], spec: CallSpec, device_type: str, comms: RingComms | None = None
) -> None:
    raise_choice(headers)
    bad = [(r, h.problem) for r, h in enumerate(headers) if h.problem]
    differ = [f for f in MUST_AGREE if len({getattr(h, f) for h in headers}) > 1]
    if bad or differ:  # every rank sees the same headers, so all take this path together
        words = _words(comms, spec)
    if not bad and differ[:1] == ["split"]:  # kinds alike, lengths not: name every rank's
        _check_lengths(headers)
    if bad:
        lines = []
        for r, problem in bad:
            got = device_name(headers[r].device)
            text = problem.message.format(
                layout=spec.layout.name,
                device=device_type,
                got=got,
                detail=words[r]["detail"],
                hint=_device_hint(got, headers[r].transport),
            )
            lines.append(f"rank {r}: {text}")
        kind = NotImplementedError if all(p.not_implemented for _, p in bad) else ValueError
        raise kind(
            "TokenRing input rejected on ring rank(s) {}:\n  {}".format(
                [r for r, _ in bad], "\n  ".join(lines)
            )
        )
    if differ:
        f = differ[0]
        if f == "options":
            _option_differs(words)
        each = ", ".join(
            f"rank {r} has {in_words(f, getattr(h, f), words[r])}" for r, h in enumerate(headers)
        )
        raise ValueError(
            f"TokenRing: {MUST_AGREE[f]} differs across ring ranks: {each}; pass the same on "
            "every rank"
        )
    _check_lengths(headers)


def _option_differs(words: list[dict]) -> None:
    """The error for agreed options that differ: the first that does, each rank's value."""
    for name, value in words[0]["options"].items():
        values = [w["options"].get(name) for w in words]
        if any(v != value for v in values):
            each = ", ".join(f"rank {r} has {v!r}" for r, v in enumerate(values))
            raise ValueError(
                f"TokenRing: {name} differs across ring ranks: {each}; pass the same on every rank"
            )


def _device_hint(got: str, transport: int) -> str:
    """The fix for tensors on a device type the transport does not move."""
    if transport == TRANSPORT_CODES["ipc"] and got != "cuda":
        return (
            " (TOKENRING_XDIT_TRANSPORT=ipc moves CUDA tensors only: move q/k/v to the GPU, or "
            f"unset it / set it to nccl or auto for {got} tensors)"
        )
    if got == "cuda":
        return " (CUDA tensors on a gloo group: TOKENRING_XDIT_TRANSPORT=ipc or auto)"
    return ""


def _words(comms: RingComms | None, spec: CallSpec) -> list[dict]:
    """Every rank's own words for an error that the headers only hold as codes (a kernel's
    reason, its family's name). Only on the error path, which every ring rank takes together."""
    mine = {"detail": spec.detail, "kernel": spec.kernel_name, "docs": _docs_words(spec),
            "split": spec.split.words, "options": dict(spec.agreed)}  # fmt: skip
    if comms is None:
        return [mine]
    everyone: list = [None] * len(comms.ranks)
    dist.all_gather_object(everyone, mine, group=comms.check)
    return everyone


def _docs_words(spec: CallSpec) -> str:
    """A rank's packed documents as a user passed them (the header holds a digest)."""
    if spec.split.docs is None:
        return "position ids" if spec.doc_positions is not None else "no documents"
    bounds = spec.split.docs.bounds
    shown = ", ".join(map(str, bounds[:12])) + (", ..." if len(bounds) > 12 else "")
    return f"cu_seqlens [{shown}] ({len(bounds) - 1} documents)"


def _check_lengths(headers: list[Header]) -> None:
    """Every rank holds T/N tokens of the split of T tokens the first rank names (any cut but a
    plain one: the header's kinds are alike here, or they differ and say so)."""
    code, lens, n = headers[0].split, [h.q_len for h in headers], len(headers)
    kind, total = KINDS[code % len(KINDS)], code // len(KINDS)
    if kind == PLAIN or any(h.split % len(KINDS) != code % len(KINDS) for h in headers):
        return
    if lens != [total // n] * n:
        raise ValueError(
            f"TokenRing: the {kind} split of {total} tokens over {n} ranks holds {total // n} "
            f"tokens on every rank: local lengths {lens} (sum {sum(lens)}). Pad the sequence to "
            "the split's length and cut it with tokenring_xdit.shard(x, group, split=split) "
            "(torch.chunk makes unequal chunks)"
        )


def _chunks(spec: CallSpec, size: int) -> int:
    """Chunks of a local shard: 2 for a zigzag shard (over a ring), else 1."""
    return 2 if spec.split.kind == ZIGZAG and size > 1 else 1


def _plan(comms, rank: int, headers: list[Header], spec: CallSpec):
    """A packed call's plan from the agreed split and documents (None: not packed)."""
    docs = _documents(comms, rank, headers, spec)
    if docs is None:
        return None
    q_lens = tuple(h.q_len for h in headers)
    return call_plan(docs, spec.split.layout(spec.causal, len(q_lens)), spec.causal, q_lens)


def _documents(comms, rank: int, headers: list[Header], spec: CallSpec) -> Documents | None:
    """The agreed packed documents (every rank's headers agree by now), checked against the
    ring's total length; from position ids through one more all-gather of every rank's claims."""
    if not spec.packed:
        return None
    q_lens = [h.q_len for h in headers]
    total = sum(q_lens)
    documents = spec.split.docs
    if documents is not None:
        if documents.total != total:
            raise ValueError(
                f"TokenRing: cu_seqlens end at {documents.total} but the ring holds "
                f"{total} tokens (local lengths {q_lens}); cu_seqlens describe the WHOLE packed "
                "sequence (pad it with one more document to the padded length)"
            )
        return documents
    chunks = _chunks(spec, len(q_lens))
    length = q_lens[rank]
    if chunks == 2:
        c, n = length // 2, len(q_lens)
        starts = [rank * c, (2 * n - 1 - rank) * c]
    else:
        starts = [sum(q_lens[:rank])]
    mine = local_claims(spec.doc_positions, starts, length)
    if comms is None:
        return documents_from_claims([mine], chunks, total)
    width = max(h.ndocs for h in headers)
    buf = torch.full((width,), -2, dtype=torch.int64)
    buf[: len(mine)] = torch.tensor(mine, dtype=torch.int64)
    everyone = [torch.empty_like(buf) for _ in headers]
    try:
        dist.all_gather(everyone, buf, group=comms.check)
    except RuntimeError as exc:
        message = (
            f"TokenRing: the exchange of packed document starts failed on "
            f"{describe_peer(comms, rank)}: {str(exc).strip().splitlines()[0][:200]}"
        )
        comms.fail(message)
        raise TokenRingCommError(message) from exc
    claims = [x[: h.ndocs].tolist() for x, h in zip(everyone, headers, strict=True)]
    return documents_from_claims(claims, chunks, total)


def _ring_device_type(comms: RingComms | None, spec: CallSpec) -> str:
    """The device type the ring's transport moves: cpu for gloo, cuda for NCCL and IPC; `auto`
    on gloo moves either (CPU tensors on gloo, CUDA tensors over IPC)."""
    if comms is None:
        return "any"  # nothing moves
    if spec.transport == "ipc":
        return "cuda"
    if spec.transport == "auto" and comms.backend == "gloo":
        device = getattr(spec.q, "device", None)
        return "cuda" if device is not None and device.type == "cuda" else "cpu"
    return "cpu" if comms.backend == "gloo" else "cuda"


def _resolve_transport(headers: list[Header], backend: str) -> str:
    """The agreed transport ("nccl" or "ipc") from every rank's header (the requested mode is
    equal on every rank by now): `auto` is ipc for CUDA tensors on a gloo group or when two
    ranks share a GPU (NCCL refuses that), else nccl."""
    code = headers[0].transport
    if code == TRANSPORT_CODES["ipc"]:
        return "ipc"
    if code == TRANSPORT_CODES["auto"] and headers[0].device == DEVICE_TYPES.index("cuda"):
        gpus = [h.gpu for h in headers]
        if backend == "gloo" or len(set(gpus)) < len(gpus):
            return "ipc"
    return "nccl"
