"""TokenRing as a transformers attention implementation, plus the batch and loss helpers
(`register`, `shard_batch`, `ring_loss`, `sync_gradients`; docs/training.md has the recipe,
packed batches included).

The attention function follows transformers' contract (transformers 5.x,
`modeling_utils.AttentionInterface`): `fn(module, query, key, value, attention_mask, dropout=,
scaling=, **kwargs)` with (b, h, s, d) tensors, K/V with their own (GQA) head count, returning
`(out (b, s, h, d), None)`; causal or not is the module's `is_causal`. transformers builds no mask
for a name its mask interface does not know; we register one that builds none either but refuses
a padding mask instead of letting transformers drop it silently (TokenRing has no masks).
Importing this module does not import transformers; `register` does.

Why the helpers: causal shards must be zigzag (`shard_batch` puts their `Split` in the batch),
labels must be shifted over the WHOLE sequence before sharding (a shard's last token predicts
another rank's first), and the loss is averaged over all ranks' tokens (`ring_loss`) with the
gradients summed over the ring (`sync_gradients`). A packed batch's documents reach the ring as
transformers' `cu_seq_lens_q` / `cu_seq_lens_k`, which the attention function passes on as
`cu_seqlens`. A layer's `sliding_window` W becomes the ring's causal `window_size=(W - 1, 0)`,
its attention sinks (`s_aux`, GPT-OSS) enter after the ring's merge (`add_attention_sink`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist

from ..ring.api import token_ring_attn_func
from ..ring.merge.sink import add_attention_sink
from ..ring.packed import Documents, documents_from_position_ids
from ..ring.split.sharding import make_split, shard

__all__ = ["NAME", "register", "unregister", "shard_batch", "ring_loss", "sync_gradients"]

NAME = "token_ring"
IGNORE_INDEX = -100  # transformers' and torch's cross-entropy default


_POSITIONS_HINT = (
    "  (transformers: the model's position_ids must be the global positions of this rank's "
    "zigzag shard: cut the batch with tokenring_xdit.integrations.transformers.shard_batch. "
    "model.generate is not sequence-parallel: generate on one process after "
    "model.set_attn_implementation('sdpa')). Packed batches (position ids that restart at each "
    "document): cut them with shard_batch(input_ids, group, position_ids=packed_position_ids), "
    "which passes the documents on as cu_seq_lens_q / cu_seq_lens_k)"
)


class TokenRingAttention:
    """transformers attention function running TokenRing over `group` (None: default group)."""

    def __init__(self, group: dist.ProcessGroup | None, kernel: str, name: str):
        self.group, self.kernel, self.name = group, kernel, name

    def __call__(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        is_causal: bool | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
        self._refuse(attention_mask, query, key, causal, kwargs)
        cu_seqlens, split = _packed_documents(kwargs), kwargs.get("split")
        # decoders pass the global position ids: the causal check verifies them against
        # shard_batch's split, or proves the zigzag layout with them where no split came along
        # (a packed batch's position ids restart: its documents come as cu_seq_lens or with
        # its split)
        packed = cu_seqlens is not None or (split is not None and split.docs is not None)
        positions = kwargs.get("position_ids") if causal and not packed else None
        try:
            out = self._ring(query, key, value, dropout, scaling, causal, positions, cu_seqlens,
                             split, kwargs)  # fmt: skip
        except ValueError as exc:
            if "positions" not in str(exc):
                raise
            # every rank raises this same error; say what it means under transformers
            raise ValueError(f"{exc}\n{_POSITIONS_HINT}") from exc
        return out.transpose(1, 2), None

    def _ring(self, query, key, value, dropout, scaling, causal, positions, cu_seqlens, split,
              kwargs):  # fmt: skip
        sinks = kwargs.get("s_aux")
        options = dict(
            dropout_p=dropout, softmax_scale=scaling, causal=causal,
            window_size=_window_size(kwargs.get("sliding_window"), causal, self.name),
            softcap=kwargs.get("softcap") or 0.0, group=self.group, layout="bhsd",
            kernel=self.kernel, split=split, positions=positions, cu_seqlens=cu_seqlens,
        )  # fmt: skip
        if sinks is None:
            return token_ring_attn_func(query, key, value, **options)
        return _ring_with_sinks(query, key, value, sinks, options)

    def _refuse(self, attention_mask, query, key, causal: bool, kwargs: dict) -> None:
        if attention_mask is not None:
            raise ValueError(
                f"attn_implementation={self.name!r}: TokenRing takes no attention mask (got "
                f"{tuple(attention_mask.shape)}); pass unpadded sequences without "
                "attention_mask (pad to a multiple of 2 x ring size with labels = -100)"
            )
        if causal and query.shape[2] != key.shape[2]:
            raise NotImplementedError(
                f"attn_implementation={self.name!r}: a decode step ({query.shape[2]} new "
                f"queries against {key.shape[2]} cached keys, e.g. model.generate) is not "
                "sequence-parallel. Generate on one process with the full sequence after "
                "model.set_attn_implementation('sdpa'), or call the model with use_cache=False"
            )


def _ring_with_sinks(query, key, value, sinks: torch.Tensor, options: dict) -> torch.Tensor:
    """The ring's attention with per-head sink logits (GPT-OSS's `s_aux`), entered once after
    the ring's merge."""
    out, lse, _ = token_ring_attn_func(query, key, value, return_attn_probs=True, **options)
    return add_attention_sink(out, lse, sinks, layout="bhsd")[0]


def _window_size(sliding_window: int | None, causal: bool, name: str) -> tuple[int, int]:
    """flash-attn's window_size for transformers' `sliding_window` W: its causal masks let a
    query see the W keys kv > q - W up to itself (masking_utils.sliding_window_overlay), i.e.
    (W - 1, 0). Non-causal windows are refused: transformers' models disagree on their width
    (|q - kv| < W in Gemma 3, <= W in ModernBERT)."""
    if sliding_window is None:
        return (-1, -1)
    whole = isinstance(sliding_window, int) and not isinstance(sliding_window, bool)
    if not whole or sliding_window < 1:
        raise ValueError(
            f"attn_implementation={name!r}: sliding_window must be an int >= 1, got "
            f"{sliding_window!r}"
        )
    if not causal:
        raise NotImplementedError(
            f"attn_implementation={name!r}: sliding_window={sliding_window} runs in causal "
            "attention only (a non-causal window's width differs between transformers models)"
        )
    return (sliding_window - 1, 0)


def _packed_documents(kwargs: dict) -> torch.Tensor | None:
    """The global cu_seqlens of a packed batch from transformers' kwargs (None: not packed)."""
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is None and cu_k is None:
        return None
    if cu_q is cu_k:  # shard_batch gives one tensor for both
        return cu_q
    # while Dynamo traces, tensor values are unknown: only the one-tensor form is taken there
    traced = torch.compiler.is_compiling()
    if cu_q is None or cu_k is None or traced or not torch.equal(cu_q.cpu(), cu_k.cpu()):
        raise ValueError(
            "TokenRing packed attention needs cu_seq_lens_q == cu_seq_lens_k (self-attention "
            "over the same packed documents); shard_batch gives both (one tensor)"
        )
    return cu_q


def _refuse_padding(*args, attention_mask: torch.Tensor | None = None, **kwargs) -> None:
    """Mask builder for our name: no mask at all (TokenRing runs exact attention over the
    ring), but a padding mask is an error rather than silently dropped."""
    if attention_mask is not None and not bool(attention_mask.all()):
        raise ValueError(
            "TokenRing takes no padding mask: pass sequences without padding, or pack them "
            "(documents end to end, position ids restarting at each, no attention_mask: "
            "DataCollatorWithFlattening) and cut the packed batch with shard_batch(input_ids, "
            "group, position_ids=...); pad only at the end, with labels = -100, to reach a "
            "multiple of 2 x ring size"
        )
    return None


def register(
    group: dist.ProcessGroup | None = None, *, name: str = NAME, kernel: str = "auto"
) -> str:
    """Register TokenRing over `group` as transformers' attention implementation `name`.

    Then `from_pretrained(..., attn_implementation=name)`, `from_config(..., attn_implementation=
    name)` or `model.set_attn_implementation(name)`. group=None is the default process group
    (the whole world); register one name per ring group to use several. `kernel`: "auto" or a
    name from `tokenring_xdit.ring.kernels.PAIRS`. Returns `name`.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, TokenRingAttention(group, kernel, name))
    AttentionMaskInterface.register(name, _refuse_padding)
    return name


def unregister(name: str = NAME) -> None:
    """Remove `name` from transformers' attention and mask interfaces."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface._global_mapping.pop(name, None)
    AttentionMaskInterface._global_mapping.pop(name, None)


def shard_batch(
    input_ids: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    *,
    labels: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    causal: bool = True,
    shift_labels: bool | None = None,
    ignore_index: int = IGNORE_INDEX,
    cu_seqlens: torch.Tensor | list[int] | None = None,
    layout: str = "auto",
) -> dict:
    """This rank's shard of a batch of FULL sequences (b, S), for the ring `group`: {"input_ids",
    "position_ids" (GLOBAL positions, for rotary/absolute embeddings), "split" (the `Split` the
    batch was cut by: the model hands it to every attention call), and "shift_labels" (causal:
    shifted over the whole sequence first, the last getting `ignore_index`) or "labels"}. Pass
    all but the labels to the model, the labels to `ring_loss`. Causal models get zigzag shards,
    others contiguous ones; S must divide by 2 x ring size (causal) or ring size (pad, labels
    -100). Packed batches: `cu_seqlens` (offsets in the full sequence) or restarting
    `position_ids` (batch size 1): per-document position ids, each document's last label
    `ignore_index`, and `cu_seq_lens_q` / `cu_seq_lens_k` (int32, CPU, the whole row's
    documents) added; `layout` ("zigzag", "contiguous", "documents", "auto") as `make_split`'s.
    """
    shift = causal if shift_labels is None else shift_labels
    docs = _batch_documents(input_ids, position_ids, cu_seqlens)
    position_ids = _positions(input_ids, position_ids, docs, cu_seqlens)
    bounds = None if docs is None else docs.bounds
    n = _group_size(group)
    split = make_split(input_ids.shape[-1], n, causal=causal, cu_seqlens=bounds, layout=layout)
    out = {
        "input_ids": shard(input_ids, group, split=split, dim=-1),
        "position_ids": shard(position_ids, group, split=split, dim=-1),
        "split": split,
    }
    if labels is None and shift:
        labels = input_ids
    if labels is not None and shift:  # over the whole sequence; a document's last: nothing
        labels = torch.cat([labels[..., 1:], torch.full_like(labels[..., :1], ignore_index)], -1)
        if docs is not None:
            ends = torch.tensor(docs.bounds[1:], device=labels.device) - 1
            labels = labels.index_fill(-1, ends, ignore_index)
    if labels is not None:
        out["shift_labels" if shift else "labels"] = shard(labels, group, split=split, dim=-1)
    if docs is not None:
        cu = torch.tensor(docs.bounds, dtype=torch.int32)  # CPU: the ring reads it on the host
        out["cu_seq_lens_q"] = out["cu_seq_lens_k"] = cu
    return out


def _positions(input_ids, position_ids, docs: Documents | None, cu_seqlens) -> torch.Tensor:
    """The batch's position ids: the given ones, the packed documents' (restarting at each),
    else the global positions."""
    if docs is not None:
        packed = _document_positions(docs).to(input_ids.device)
        if position_ids is None:
            return packed.unsqueeze(0).expand(input_ids.shape[0], -1)
        if cu_seqlens is not None:
            _check_positions_match(position_ids, packed, docs)
    if position_ids is None:
        position_ids = torch.arange(input_ids.shape[-1], device=input_ids.device)
        position_ids = position_ids.unsqueeze(0).expand(input_ids.shape[0], -1)
    return position_ids


def _document_positions(docs: Documents) -> torch.Tensor:
    """(S,) positions restarting at 0 at each document's offset."""
    lengths = [b - a for a, b in zip(docs.bounds, docs.bounds[1:], strict=False)]
    starts = torch.tensor(docs.bounds[:-1]).repeat_interleave(torch.tensor(lengths))
    return torch.arange(docs.total) - starts


def _check_positions_match(position_ids: torch.Tensor, packed: torch.Tensor, docs) -> None:
    """Both given: the model would get `position_ids` while attention and labels follow
    `cu_seqlens`; refuse a disagreement (the same full batch on every rank: every rank raises)."""
    rows = position_ids.reshape(-1, position_ids.shape[-1])
    if rows.shape[-1] != packed.shape[-1]:
        raise ValueError(
            f"shard_batch: position_ids has {rows.shape[-1]} positions, cu_seqlens covers "
            f"{packed.shape[-1]} tokens"
        )
    bad = (rows != packed.to(rows.device)).any(dim=0).nonzero()
    if bad.numel():
        at = int(bad[0])
        raise ValueError(
            f"shard_batch: position_ids and cu_seqlens disagree at token {at} (position_ids "
            f"{rows[:, at].tolist()}, cu_seqlens {list(docs.bounds)} implies {int(packed[at])}): "
            "pass only one of them, or position ids that restart at 0 at each cu_seqlens offset"
        )


def _batch_documents(input_ids, position_ids, cu_seqlens) -> Documents | None:
    """The documents of a packed batch (None: not packed: no cu_seqlens and position ids that
    never restart)."""
    if cu_seqlens is not None:
        return Documents.of(cu_seqlens, total=input_ids.shape[-1])
    if position_ids is None or position_ids.shape[-1] < 2:
        return None
    if not bool((position_ids[..., 1:] == 0).any()):
        return None  # one document per row: the plain (global positions) path
    return documents_from_position_ids(position_ids)


def _group_size(group: dist.ProcessGroup | None) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


def _sum_over(group, values: torch.Tensor) -> torch.Tensor:
    """all_reduce(SUM) of a small tensor over `group`, on the device its backend moves."""
    if _group_size(group) == 1:
        return values
    device = "cpu" if dist.get_backend(group) == "gloo" else values.device
    buf = values.to(device)
    dist.all_reduce(buf, group=group)
    return buf.to(values.device)


def ring_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    *,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """Cross-entropy averaged over the labelled tokens of ALL ranks of `group`.

    logits (b, s_local, vocab), labels (b, s_local) as `shard_batch` gave them. The returned
    value is the loss of the whole batch (equal on every rank, fp32); its gradient is this
    rank's share (its tokens' sum over the global token count), so the ranks' parameter
    gradients SUM to the full gradient: call `sync_gradients` after backward (or, under DDP,
    which averages, multiply the loss by the group size first).
    """
    local = torch.nn.functional.cross_entropy(
        logits.float().flatten(0, -2),
        labels.flatten().to(logits.device),
        ignore_index=ignore_index,
        reduction="sum",
    )
    count = (labels != ignore_index).sum().to(local.dtype)
    total_sum, total_count = _sum_over(group, torch.stack([local.detach(), count])).unbind()
    share = local / total_count.clamp_min(1)
    # value: the whole batch's loss; gradient: this rank's share of it
    return share + (total_sum / total_count.clamp_min(1) - share).detach()


def sync_gradients(
    model: torch.nn.Module | Iterable[torch.nn.Parameter], group: dist.ProcessGroup | None = None
) -> None:
    """Sum the parameter gradients over `group` (every rank's tokens' share, see ring_loss);
    one flat all-reduce."""
    params = model.parameters() if isinstance(model, torch.nn.Module) else model
    grads = [p.grad for p in params if p.grad is not None]
    if not grads or _group_size(group) == 1:
        return
    gloo = dist.get_backend(group) == "gloo"
    for dtype in {g.dtype for g in grads}:  # one flat all-reduce per dtype
        same = [g for g in grads if g.dtype == dtype]
        flat = torch.cat([g.reshape(-1) for g in same])
        buf = flat.cpu() if gloo else flat
        dist.all_reduce(buf, group=group)
        offset = 0
        for g in same:
            g.copy_(buf[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
