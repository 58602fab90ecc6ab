"""Packed-batch training through transformers over 2 and 3 gloo ranks equals one process.

A tiny random LlamaForCausalLM (GQA: 4 query heads, 2 K/V heads) with
`attn_implementation="token_ring"` trains 2 SGD steps on packed batches (documents end to end,
batch size 1, one document crossing every shard boundary, length-1 documents): step 1 passes
the packed position ids to `shard_batch`, step 2 cu_seqlens. The reference is one process
running each document ALONE through the same model (SDPA): the loss summed over every
document's tokens over the total count, so it does not depend on transformers' own packing
detection. Loss and every parameter gradient are compared at every step, with the batch cut in
the row's zigzag, in the documents layout (every document in 2N pieces) and in contiguous
shards (documents whole where a shard holds them).
"""

from __future__ import annotations

import functools

import pytest

from tests.distributed.test_llm_training import optimizer_step
from tests.harness import run_ranks, tiny_llama_config, values

SEQ = 24  # divides by 2N for N = 2, 3
PACKINGS = ([5, 1, 9, 3, 6], [1, 13, 1, 1, 8])  # document lengths of the two steps
LOSS_TOL = 1e-6
GRAD_REL_TOL = 1e-4
LAYOUTS = ("zigzag", "documents", "contiguous")  # shard_batch(layout=)


def _llama(impl: str):
    import torch
    from transformers import AutoModelForCausalLM

    cfg = tiny_llama_config(tie_word_embeddings=False)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=impl)


def _batches(torch):
    gen = torch.Generator().manual_seed(9)
    out = []
    for lengths in PACKINGS:
        ids = torch.randint(0, 64, (1, SEQ), generator=gen)
        pos = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        out.append((ids, pos, cu))
    return out


def _train(torch, ring: bool, layout: str = "zigzag"):
    from tokenring_xdit.integrations import transformers as tr_hf

    model = _llama("token_ring" if ring else "sdpa")
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, grads = [], []
    for step, (ids, pos, cu) in enumerate(_batches(torch)):
        if ring:
            packed = {"position_ids": pos} if step == 0 else {"cu_seqlens": cu}
            batch = tr_hf.shard_batch(ids, layout=layout, **packed)
            labels = batch.pop("shift_labels")
            loss = tr_hf.ring_loss(model(**batch).logits, labels)
        else:  # every document alone, its tokens' summed loss over the whole count
            total, count = 0.0, 0
            for a, b in zip(cu.tolist(), cu.tolist()[1:], strict=False):
                doc = ids[:, a:b]
                logits = model(input_ids=doc).logits[:, :-1]
                total = total + torch.nn.functional.cross_entropy(
                    logits.flatten(0, 1), doc[:, 1:].flatten(), reduction="sum"
                )
                count += b - a - 1
            loss = total / count
        value, step_grads = optimizer_step(model, opt, loss, ring)
        losses.append(value)
        grads.append(step_grads)
    return losses, grads


def _refusal(torch):
    """Packed position ids that reach the attention function without their documents or split
    (the batch was not cut by shard_batch's packed path) are refused, saying the packed way."""
    from tokenring_xdit.integrations import transformers as tr_hf

    model = _llama("token_ring")
    ids, pos, _ = _batches(torch)[0]
    batch = tr_hf.shard_batch(ids, position_ids=pos)
    for key in ("cu_seq_lens_q", "cu_seq_lens_k", "split", "shift_labels"):
        batch.pop(key)
    try:
        model(**batch)
    except ValueError as exc:
        return str(exc)
    return "no error"


def _unpacked_loss(torch) -> float:
    """Step 1's batch as ONE sequence (no documents): what the packed loss must differ from."""
    from tokenring_xdit.integrations import transformers as tr_hf

    ids = _batches(torch)[0][0]
    batch = tr_hf.shard_batch(ids)
    labels = batch.pop("shift_labels")
    with torch.no_grad():
        return tr_hf.ring_loss(_llama("token_ring")(**batch).logits, labels).item()


def _worker(rank, n):
    import torch

    from tokenring_xdit.integrations import transformers as tr_hf

    torch.set_num_threads(1)
    tr_hf.register()
    ref_losses, ref_grads = _train(torch, ring=False)
    out = {"refusal": _refusal(torch), "unpacked_loss": _unpacked_loss(torch)}
    for layout in LAYOUTS:
        ring_losses, ring_grads = _train(torch, ring=True, layout=layout)
        worst = 0.0
        for got, want in zip(ring_grads, ref_grads, strict=True):
            for name, g in want.items():
                scale = g.abs().max().clamp_min(1e-6)
                worst = max(worst, ((got[name] - g).abs().max() / scale).item())
        out[layout] = {
            "loss_err": max(abs(a - b) for a, b in zip(ring_losses, ref_losses, strict=True)),
            "grad_rel_err": worst,
            "losses": ring_losses,
            "params": len(ref_grads[0]),
        }
    return out


@functools.cache
def _launch(n):
    return values(run_ranks(_worker, n, timeout=300))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n", [2, 3])
def test_packed_llama_training_matches_one_process(n, layout):
    for rank, res in enumerate(_launch(n)):
        got = {**res[layout], "unpacked_loss": res["unpacked_loss"]}
        print(f"N={n} {layout} rank {rank}: loss err {got['loss_err']:.3g}, grad rel err "
              f"{got['grad_rel_err']:.3g}, losses {got['losses']}, unpacked "
              f"{got['unpacked_loss']:.6f}")  # fmt: skip
        assert got["params"] > 10, got
        assert got["loss_err"] <= LOSS_TOL, (n, rank, got)
        assert got["grad_rel_err"] <= GRAD_REL_TOL, (n, rank, got)
        assert got["losses"][0] != got["losses"][1], got
        # the documents matter: the same tokens as one sequence give another loss
        assert abs(got["unpacked_loss"] - got["losses"][0]) > 1e-3, got


@pytest.mark.parametrize("n", [2, 3])
def test_packed_positions_without_documents_are_refused(n):
    for got in _launch(n):
        assert "zigzag positions" in got["refusal"], got["refusal"]
        assert "Packed batches" in got["refusal"], got["refusal"]
