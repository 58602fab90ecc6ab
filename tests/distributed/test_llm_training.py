"""LLM training with TokenRing on real gloo ranks: GQA inside the ring, the sharding helpers and
the transformers integration, against exact fp64 attention or one process.

One launch per world size (N = 2, 3, 4; CI has 2 cores): the rank function runs every case and
returns numbers; the tests assert on them.
- GQA (4 query heads; 2 and 1 K/V heads) through `token_ring_attn_func`, causal (zigzag shards
  cut by `tokenring_xdit.shard`) and not, with a kernel that takes GQA itself (CPU flash) and one
  that needs K/V expanded per block (math): out/dq/dk/dv vs autograd of fp64 attention; the
  bytes sent equal those of the same call with as many K/V heads as query heads (K/V never
  travel); the no-grad inference path too.
- yunchang's LongContextAttention with 2 K/V heads (N = 4: ulysses 2 x ring 2).
- transformers: a tiny LlamaForCausalLM with 4 K/V heads (MHA), 2 and 1, and a tiny BERT
  (non-causal encoder, masked LM), 3 SGD steps with `attn_implementation="token_ring"`,
  `shard_batch`, `ring_loss`, `sync_gradients`: loss and every parameter gradient at every step
  vs the same steps in one process (SDPA on the full batch).
"""

from __future__ import annotations

import functools

import pytest

from tests.harness import run_ranks, tiny_llama_config, values

WORLD_SIZES = [2, 3, 4]
FP32_TOL = 2e-5
LOSS_TOL = 1e-6
GRAD_REL_TOL = 1e-4
SEQ = 24  # divides by 2N for N = 2, 3, 4


# --- GQA through the functional API ---------------------------------------------------------


def _gqa_case(rank, n, torch, *, kv_heads, causal, kernel, layout):
    from tokenring_xdit import make_split, shard, token_ring_attn_func
    from tokenring_xdit.ring.comm import COUNTERS

    gen = torch.Generator().manual_seed(10 * kv_heads + int(causal))
    b, h, s, d = 2, 4, 4 * n, 16
    q, do = (torch.randn(b, s, h, d, generator=gen, dtype=torch.float64) for _ in "qo")
    k, v = (torch.randn(b, s, kv_heads, d, generator=gen, dtype=torch.float64) for _ in "kv")
    ref_in = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(x.transpose(1, 2) for x in ref_in), is_causal=causal, enable_gqa=True
    ).transpose(1, 2)
    ref.backward(do)

    split = make_split(s, n, causal=causal)

    def local(x):  # (b, S, h, d) fp64 -> this rank's fp32 shard in the case's layout
        x = shard(x, split=split, dim=1).float()
        return (x if layout == "bshd" else x.transpose(1, 2)).contiguous()

    def run(kv_expand: int):
        ql = local(q).requires_grad_()
        kl, vl = (local(x.repeat_interleave(kv_expand, dim=2)).requires_grad_() for x in (k, v))
        COUNTERS.reset()
        out = token_ring_attn_func(ql, kl, vl, causal=causal, layout=layout, kernel=kernel,
                                   split=split)  # fmt: skip
        out.backward(local(do))
        return out, (ql.grad, kl.grad, vl.grad), COUNTERS.bytes_sent

    out, grads, sent = run(1)
    _, _, sent_mha = run(h // kv_heads)

    def back(x):
        return x.double() if layout == "bshd" else x.double().transpose(1, 2)

    errs = {"out": (back(out) - shard(ref.detach(), causal=causal)).abs().max().item()}
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref_in, strict=True):
        errs[name] = (back(g) - shard(r.grad, causal=causal)).abs().max().item()
    errs["dk_shape_ok"] = tuple(grads[1].shape) == tuple(local(k).shape)
    if not causal:  # the no-grad inference path (forward.py) with the same kernel choice
        from tokenring_xdit import token_ring_attn

        with torch.no_grad():
            inf, _ = token_ring_attn(
                local(q), local(k), local(v), layout=layout, kernel=kernel, cuda_graph=False
            )
        errs["inference_out"] = (back(inf) - shard(ref.detach(), causal=False)).abs().max().item()
    return {"errs": errs, "bytes": sent, "bytes_mha": sent_mha}


def _gqa_cases(rank, n, torch):
    out = {}
    for kv_heads in (2, 1):
        for causal in (True, False):
            for kernel, layout in (("auto", "bshd"), ("math", "bhsd")):
                tag = f"kv{kv_heads}-{'causal' if causal else 'full'}-{kernel}-{layout}"
                out[tag] = _gqa_case(
                    rank, n, torch, kv_heads=kv_heads, causal=causal, kernel=kernel, layout=layout
                )
    return out


def _unshard_roundtrip(torch):
    from tokenring_xdit import shard, unshard

    x = torch.arange(2 * 24 * 3, dtype=torch.float32).reshape(2, 24, 3)
    ok = {}
    for causal in (True, False):
        ok[causal] = torch.equal(unshard(shard(x, causal=causal), causal=causal), x)
    try:
        shard(x[:, :23], causal=True)
        ok["bad_length"] = "no error"
    except ValueError as exc:
        ok["bad_length"] = str(exc)
    return ok


# --- yunchang ----------------------------------------------------------------------------------


def _yunchang_gqa(rank, n, torch):
    """LongContextAttention(ring_impl_type='token_ring') with 4 query heads, 2 K/V heads."""
    import tokenring_xdit

    tokenring_xdit.install()
    from yunchang import EXTRACT_FUNC_DICT, LongContextAttention, set_seq_parallel_pg
    from yunchang.kernels import AttnType

    ulysses = 2 if n == 4 else 1
    ring = n // ulysses
    set_seq_parallel_pg(ulysses, ring, rank, n)
    gen = torch.Generator().manual_seed(77)
    b, s, h, hk, d = 2, 8 * n, 4, 2, 40
    q, do = (torch.randn(b, s, h, d, generator=gen, dtype=torch.float64) for _ in "qo")
    k, v = (torch.randn(b, s, hk, d, generator=gen, dtype=torch.float64) for _ in "kv")

    def shard(x):
        return EXTRACT_FUNC_DICT["token_ring"](x, rank, world_size=n, rd=ring, ud=ulysses)

    errs = {}
    for causal in (True, False):
        ref_in = [x.clone().requires_grad_() for x in (q, k, v)]
        ref = torch.nn.functional.scaled_dot_product_attention(
            *(x.transpose(1, 2) for x in ref_in), is_causal=causal, enable_gqa=True
        ).transpose(1, 2)
        ref.backward(do)
        layer = LongContextAttention(ring_impl_type="token_ring", attn_type=AttnType.TORCH_MATH)
        loc = [shard(x).float().requires_grad_() for x in (q, k, v)]
        out = layer(*loc, causal=causal)
        out.backward(shard(do).float())
        tag = f"u{ulysses}xr{ring}-{'causal' if causal else 'full'}"
        errs[tag] = {"out": (out.double() - shard(ref.detach())).abs().max().item()}
        for name, x, r in zip(("dq", "dk", "dv"), loc, ref_in, strict=True):
            errs[tag][name] = (x.grad.double() - shard(r.grad)).abs().max().item()
    return errs


# --- transformers ------------------------------------------------------------------------------


def _llama(kv_heads, impl):
    import torch
    from transformers import AutoModelForCausalLM

    cfg = tiny_llama_config(kv_heads=kv_heads, tie_word_embeddings=False)
    torch.manual_seed(0)  # the same weights on every rank and in the single process
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=impl)


def _bert(impl):
    import torch
    from transformers import AutoModelForMaskedLM, BertConfig

    cfg = BertConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForMaskedLM.from_config(cfg, attn_implementation=impl)


def _batches(torch, causal: bool):
    gen = torch.Generator().manual_seed(5)
    out = []
    for _ in range(3):
        ids = torch.randint(0, 64, (2, SEQ), generator=gen)
        labels = None
        if not causal:  # masked LM: a third of the positions are predicted, the rest ignored
            keep = torch.rand(2, SEQ, generator=gen) < 0.33
            labels = torch.where(keep, torch.randint(0, 64, (2, SEQ), generator=gen), -100)
        out.append((ids, labels))
    return out


def _train(build, torch, causal: bool, ring: bool):
    """3 SGD steps; per step the loss and every parameter gradient (summed over ranks)."""
    from tokenring_xdit.integrations import transformers as tr_hf

    model = build("token_ring" if ring else "sdpa")
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, grads = [], []
    for ids, labels in _batches(torch, causal):
        if ring:
            batch = tr_hf.shard_batch(ids, labels=labels, causal=causal)
            labels_local = batch.pop("shift_labels" if causal else "labels")
            loss = tr_hf.ring_loss(model(**batch).logits, labels_local)
        else:  # one process, the model's own loss (it shifts causal labels itself)
            loss = model(input_ids=ids, labels=ids if causal else labels).loss
        value, step_grads = optimizer_step(model, opt, loss, ring)
        losses.append(value)
        grads.append(step_grads)
    return losses, grads


def optimizer_step(model, opt, loss, ring: bool) -> tuple[float, dict]:
    """Backward, gradient sync across the ring (ring runs), SGD step: (loss, fp64 grads)."""
    from tokenring_xdit.integrations import transformers as tr_hf

    opt.zero_grad()
    loss.backward()
    if ring:
        tr_hf.sync_gradients(model)
    grads = {n: p.grad.double().clone() for n, p in model.named_parameters()}
    opt.step()
    return loss.item(), grads


def _compare(build, torch, causal):
    ring_losses, ring_grads = _train(build, torch, causal, ring=True)
    ref_losses, ref_grads = _train(build, torch, causal, ring=False)
    loss_err = max(abs(a - b) for a, b in zip(ring_losses, ref_losses, strict=True))
    worst = 0.0
    for got, want in zip(ring_grads, ref_grads, strict=True):
        assert got.keys() == want.keys()
        for name, g in want.items():
            # floor: the key bias's gradient is 0 in exact arithmetic (softmax ignores a shift
            # of every score of a row), rounding noise of ~1e-12 in both runs
            scale = g.abs().max().clamp_min(1e-6)
            worst = max(worst, ((got[name] - g).abs().max() / scale).item())
    return {
        "loss_err": loss_err,
        "grad_rel_err": worst,
        "losses": ring_losses,
        "params": len(ref_grads[0]),
    }


def _refusals(torch):
    """Through the integration: position ids that are not this rank's zigzag positions (here:
    contiguous shards, as a naive split gives) are refused on every rank by the causal check,
    although `shard_batch` declared a zigzag split; so is a decode step (generate)."""
    from tokenring_xdit.integrations import transformers as tr_hf

    model = _llama(2, "token_ring")
    ids = torch.randint(0, 64, (2, SEQ))
    batch = tr_hf.shard_batch(ids, causal=True)
    local = batch["input_ids"].shape[1]
    rank = torch.distributed.get_rank()
    batch["position_ids"] = torch.arange(rank * local, (rank + 1) * local).expand(2, -1)
    found = {}
    for name, call in {
        "contiguous_positions": lambda: model(**batch),
        "generate": lambda: model.generate(batch["input_ids"], max_new_tokens=2),
    }.items():
        try:
            call()
            found[name] = "no error"
        except (ValueError, NotImplementedError) as exc:
            found[name] = f"{type(exc).__name__}: {exc}"
    return found


def _transformers(rank, n, torch):
    from tokenring_xdit.integrations import transformers as tr_hf

    tr_hf.register()
    out = {
        f"llama-kv{kv}": _compare(functools.partial(_llama, kv), torch, True) for kv in (4, 2, 1)
    }
    out["bert"] = _compare(_bert, torch, False)
    out["refusals"] = _refusals(torch)
    return out


def _worker(rank, n):
    import torch
    import torch.distributed as dist

    from tokenring_xdit.ring import setup_token_ring_group
    from tokenring_xdit.ring.comm import groups

    torch.set_num_threads(1)
    setup_token_ring_group(None)  # None: the default group, as in token_ring_attn
    return {
        "setup_none": dist.group.WORLD in groups.LIVE.comms,
        "gqa": _gqa_cases(rank, n, torch),
        "unshard": _unshard_roundtrip(torch),
        "yunchang": _yunchang_gqa(rank, n, torch),
        "transformers": _transformers(rank, n, torch),
    }


@functools.cache
def _launch(n):
    return values(run_ranks(_worker, n, timeout=300))


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_gqa_forward_and_gradients_match_exact_attention(n):
    failures = []
    for rank, res in enumerate(_launch(n)):
        for tag, got in res["gqa"].items():
            errs = dict(got["errs"])
            assert errs.pop("dk_shape_ok"), (n, rank, tag, "dK/dV not in the K/V head count")
            failures += [
                f"N={n} rank {rank} {tag} {what}: {err:.3g}"
                for what, err in errs.items()
                if not err <= FP32_TOL
            ]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_gqa_sends_what_mha_with_the_same_query_sends(n):
    """K/V never travel: a GQA call moves exactly the bytes of the same call without GQA."""
    for rank, res in enumerate(_launch(n)):
        for tag, got in res["gqa"].items():
            assert got["bytes"] > 0 and got["bytes"] == got["bytes_mha"], (n, rank, tag, got)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_setup_token_ring_group_none_sets_up_the_default_group(n):
    assert all(res["setup_none"] for res in _launch(n))


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_shard_unshard_roundtrip_and_length_error(n):
    for res in _launch(n):
        got = res["unshard"]
        assert got[True] and got[False], got
        assert "pad the sequence" in got["bad_length"], got


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_yunchang_gqa_matches_exact_attention(n):
    for rank, res in enumerate(_launch(n)):
        for tag, errs in res["yunchang"].items():
            for what, err in errs.items():
                assert err <= FP32_TOL, f"N={n} rank {rank} {tag} {what}: {err:.3g}"


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("model", ["llama-kv4", "llama-kv2", "llama-kv1", "bert"])
def test_transformers_training_matches_one_process(n, model):
    for rank, res in enumerate(_launch(n)):
        got = res["transformers"][model]
        assert got["params"] > 10, got
        assert got["loss_err"] <= LOSS_TOL, (n, rank, model, got)
        assert got["grad_rel_err"] <= GRAD_REL_TOL, (n, rank, model, got)
        assert len(set(got["losses"])) == 3, got  # it trains: the loss moves every step


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_transformers_refuses_wrong_positions_and_decoding_on_every_rank(n):
    for rank, res in enumerate(_launch(n)):
        got = res["transformers"]["refusals"]
        assert got["contiguous_positions"].startswith("ValueError"), (rank, got)
        assert "zigzag positions" in got["contiguous_positions"], (rank, got)
        # the prefill step already fails: its positions (0..s-1 on every rank) are no zigzag
        # shard's; the message says what generate needs
        assert got["generate"].startswith("ValueError"), (rank, got)
        assert "shard_batch" in got["generate"], (rank, got)
        assert "generate is not sequence-parallel" in got["generate"], (rank, got)
