"""Sliding-window layers and attention sinks through the transformers integration, one training
step over 2 and 3 gloo ranks equal to one process.

Tiny random configs built in code (no hub): GptOssForCausalLM (sliding and full layers in turn,
a learned sink logit per head, MoE), Gemma3ForCausalLM text-only (six layers: five sliding, one
full, two rotary bases) and MistralForCausalLM (sliding everywhere), all GQA (4 query heads, 2
K/V heads). Each takes one step with `attn_implementation="token_ring"` on batches cut by
`shard_batch` (plain rows, b = 2; packed rows, one row of documents, one crossing the shard
boundaries; zigzag, contiguous shards with the window of 10, and the documents layout, every
document in 2N pieces), windows of 3 tokens (inside a
zigzag chunk: 6 tokens at N = 2, 4 at N = 3) and of 10 (across chunks and ranks). The reference
is one process with transformers' own attention (eager for GPT-OSS, whose sinks SDPA lacks; SDPA
otherwise), each packed document run alone: the loss and every parameter's gradient (the sinks'
included) must match. Only rank 0 runs the references (the ranks' gradients are synced, so rank
0 holds the full ones). GPT-OSS also takes its step under torch.compile (N = 2), equal to eager.

Guards against passing by accident: the reference's loss under window W + 1, and without the
sinks, differs from the one compared by well over the bound (an off-by-one in the window mapping
or a dropped sink would show), the sinks' gradient is well above the comparison's floor. Refused
on every rank: a window in a non-causal layer.
"""

from __future__ import annotations

import functools

import pytest

from tests.harness import run_ranks, values

SEQ = 24  # divides by 2N for N = 2, 3
PACKING = [4, 1, 13, 6]  # document lengths of the packed row: 13 crosses the shard boundaries
WINDOWS = (3, 10)
MODELS = ("gpt_oss", "gemma3", "mistral")
ROWS = ("plain", "packed")  # packed: shard_batch's own layout choice (zigzag here)
LOSS_TOL = 1e-6
GRAD_REL_TOL = 1e-4
REFERENCE = {"gpt_oss": "eager", "gemma3": "sdpa", "mistral": "sdpa"}


def _config(kind: str, window: int, **extra):
    import transformers as tf

    common = dict(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=window,
        **extra,
    )  # fmt: skip
    if kind == "gpt_oss":
        rope = {"rope_type": "default", "rope_theta": 10000.0}
        return tf.GptOssConfig(
            num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2,
            rope_parameters=rope, tie_word_embeddings=False, **common,
        )  # fmt: skip
    if kind == "gemma3":
        return tf.Gemma3TextConfig(num_hidden_layers=6, **common)
    return tf.MistralConfig(num_hidden_layers=2, tie_word_embeddings=False, **common)


def _model(kind: str, window: int, impl: str, **extra):
    """The same weights on every rank and in the reference (seeded); GPT-OSS's sinks drawn
    at scale 1 so that they matter (its initialisation makes them ~0.02)."""
    import torch
    import transformers as tf

    cfg = _config(kind, window, **extra)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl)
    assert kind != "gemma3" or type(model) is tf.Gemma3ForCausalLM  # text-only
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.copy_(torch.randn(p.shape, generator=gen))
    return model


def _batch(torch, rows: str):
    """(input_ids, packed position ids or None, the documents' offsets or None)."""
    gen = torch.Generator().manual_seed(5)
    if rows == "plain":
        return torch.randint(0, 64, (2, SEQ), generator=gen), None, None
    # packed ("packed", or cut in another layout: "packed-contiguous", "packed-documents")
    ids = torch.randint(0, 64, (1, SEQ), generator=gen)
    pos = torch.cat([torch.arange(n) for n in PACKING]).unsqueeze(0)
    cu = [0, *torch.tensor(PACKING).cumsum(0).tolist()]
    return ids, pos, cu


def _grads(model) -> dict:
    return {n: p.grad.double().clone() for n, p in model.named_parameters()}


def _ring_step(torch, kind, window, rows, compiled=False):
    from tokenring_xdit.integrations import transformers as tr_hf

    model = _model(kind, window, "token_ring")
    run = torch.compile(model, backend="aot_eager") if compiled else model
    ids, pos, _ = _batch(torch, rows)
    layout = rows.split("-")[1] if "-" in rows else "auto"
    batch = tr_hf.shard_batch(ids, position_ids=pos, layout=layout)
    assert layout == "auto" or batch["split"].kind == layout, (layout, batch["split"])
    labels = batch.pop("shift_labels")
    loss = tr_hf.ring_loss(run(**batch).logits, labels)
    loss.backward()
    tr_hf.sync_gradients(model)
    return loss.item(), _grads(model)


def _reference_loss(torch, model, rows):
    """One process: the model's own loss on plain rows; packed: every document alone, its
    tokens' summed loss over the whole count."""
    ids, _, cu = _batch(torch, rows)
    if rows == "plain":
        return model(input_ids=ids, labels=ids).loss
    total, count = 0.0, 0
    for a, b in zip(cu, cu[1:], strict=False):
        doc = ids[:, a:b]
        logits = model(input_ids=doc).logits[:, :-1]
        total = total + torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), doc[:, 1:].flatten(), reduction="sum"
        )
        count += b - a - 1
    return total / count


def _reference_step(torch, kind, window, rows):
    model = _model(kind, window, REFERENCE[kind])
    loss = _reference_loss(torch, model, rows)
    loss.backward()
    with torch.no_grad():  # the same batch under the next wider window, and without sinks
        wider = _model(kind, window + 1, REFERENCE[kind])
        gaps = {"off_by_one_gap": _reference_loss(torch, wider, rows)}
        if kind == "gpt_oss":
            for name, p in model.named_parameters():
                if name.endswith("sinks"):
                    p.fill_(-1e4)  # exp(-1e4) = 0: as if there were no sink
            gaps["no_sink_gap"] = _reference_loss(torch, model, rows)
    gaps = {name: abs(other.item() - loss.item()) for name, other in gaps.items()}
    return loss.item(), _grads(model), gaps


def _compare(torch, kind, window, rows) -> dict | None:
    ring_loss, ring_grads = _ring_step(torch, kind, window, rows)
    if torch.distributed.get_rank() != 0:
        return None
    ref_loss, ref_grads, gaps = _reference_step(torch, kind, window, rows)
    assert ring_grads.keys() == ref_grads.keys()
    worst, worst_name = 0.0, ""
    for name, g in ref_grads.items():
        # floor: gradients that are 0 in exact arithmetic (a key bias) carry rounding only
        err = ((ring_grads[name] - g).abs().max() / g.abs().max().clamp_min(1e-6)).item()
        if err >= worst:
            worst, worst_name = err, name
    sinks = [g.abs().max().item() for n, g in ref_grads.items() if n.endswith("sinks")]
    return {
        "loss_err": abs(ring_loss - ref_loss),
        "grad_rel_err": worst,
        "worst_param": worst_name,
        "params": len(ref_grads),
        "sink_grad": min(sinks) if sinks else None,
        **gaps,
    }


def _compiled(torch) -> dict:
    """GPT-OSS under torch.compile (the ring's compiled operator gives lse with its gradient,
    which the sinks' backward needs) against the same step eager."""
    eager_loss, eager = _ring_step(torch, "gpt_oss", 3, "plain")
    loss, grads = _ring_step(torch, "gpt_oss", 3, "plain", compiled=True)
    worst = max(((grads[k] - g).abs().max() / g.abs().max().clamp_min(1e-6)).item()
                for k, g in eager.items())  # fmt: skip
    return {"loss_err": abs(loss - eager_loss), "grad_rel_err": worst}


def _refusals(torch) -> dict:
    """Gemma 3's bidirectional variant: a window in a non-causal layer is refused."""
    from tokenring_xdit.integrations import transformers as tr_hf

    model = _model("gemma3", 3, "token_ring", use_bidirectional_attention=True)
    batch = tr_hf.shard_batch(_batch(torch, "plain")[0], causal=False)
    calls = {"non_causal": lambda: model(**batch)}
    found = {}
    for name, call in calls.items():
        try:
            call()
            found[name] = "no error"
        except NotImplementedError as exc:
            found[name] = f"NotImplementedError: {exc}"
    return found


def _worker(rank, n):
    import torch

    from tokenring_xdit.integrations import transformers as tr_hf

    torch.set_num_threads(1)
    tr_hf.register()
    out = {case: _compare(torch, *_parse(case)) for case in CASES}
    out["refusals"] = _refusals(torch)
    if n == 2:
        out["compiled"] = _compiled(torch)
    return out


# every model, window and row kind; packed rows cut in contiguous shards (the window across
# the shards) and in the documents layout (a window of 3 against pieces of 2-4 tokens of the
# long document; of 10, across its pieces on every rank)
CASES = [f"{k}-w{w}-{r}" for k in MODELS for w in WINDOWS for r in ROWS]
CASES += [f"{k}-w10-packed-contiguous" for k in MODELS]
CASES += ["gpt_oss-w3-packed-documents", "gemma3-w10-packed-documents"]
CASES += ["mistral-w3-packed-documents"]


def _parse(case: str) -> tuple[str, int, str]:
    kind, window, rows = case.split("-", 2)
    return kind, int(window[1:]), rows


@functools.cache
def _launch(n):
    return values(run_ranks(_worker, n, timeout=240))


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("case", CASES)
def test_window_models_train_like_one_process(n, case):
    got = _launch(n)[0][case]
    assert got["params"] >= 10, got
    assert got["loss_err"] <= LOSS_TOL, (n, case, got)
    assert got["grad_rel_err"] <= GRAD_REL_TOL, (n, case, got)
    # an off-by-one in the window, or sinks left out, would move the loss well past its bound
    assert got["off_by_one_gap"] > 10 * LOSS_TOL, (n, case, got)
    if case.startswith("gpt_oss"):
        assert got["no_sink_gap"] > 10 * LOSS_TOL, (n, case, got)
        assert got["sink_grad"] > 100 * 1e-6, (n, case, got)  # well above the compare's floor


@pytest.mark.parametrize("n", [2, 3])
def test_non_causal_window_is_refused_on_every_rank(n):
    for rank, res in enumerate(_launch(n)):
        got = res["refusals"]
        assert got["non_causal"].startswith("NotImplementedError"), (rank, got)
        assert "causal attention only" in got["non_causal"], (rank, got)


def test_gpt_oss_sinks_compiled_train_like_eager():
    got = _launch(2)[0]["compiled"]
    assert got["loss_err"] <= LOSS_TOL and got["grad_rel_err"] <= GRAD_REL_TOL, got
