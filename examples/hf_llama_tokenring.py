"""Train a tiny random transformers Llama (GQA) with TokenRing sequence parallelism.

The model is `transformers.LlamaForCausalLM` (random weights, no download) loaded with
`attn_implementation="token_ring"` after `tokenring_xdit.register_transformers()`;
each rank holds the zigzag shard of every sequence (`shard_batch`: input ids, global position
ids, labels shifted over the whole sequence), the loss is averaged over the tokens of all ranks
(`ring_loss`) and the gradients are summed over them (`sync_gradients`). The same steps run in
one process (SDPA, the full batch) on every rank, and rank 0 prints both losses side by side.

    torchrun --nproc-per-node 2 examples/hf_llama_tokenring.py             # CPU, gloo
    torchrun --nproc-per-node 4 examples/hf_llama_tokenring.py --kv-heads 1
    torchrun --nproc-per-node 2 examples/hf_llama_tokenring.py --device cuda --dtype bfloat16
    python examples/hf_llama_tokenring.py --device cuda --dtype bfloat16   # one process: ring 1
"""

from __future__ import annotations

import argparse
import os


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--seq", type=int, default=96, help="tokens per sequence (all ranks)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2, help="K/V heads (GQA: fewer than --heads)")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    from tokenring_xdit.tools.rank_exit import one_line_usage_errors

    return one_line_usage_errors(p).parse_args()


# Run as a script, the arguments parse before torch loads (seconds, tens on a busy machine): a
# bad flag or --help answers at once.
ARGS = parse() if __name__ == "__main__" else None

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from tokenring_xdit.integrations import transformers as tr_hf  # noqa: E402


def build(impl: str, args: argparse.Namespace) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.seq,
        use_cache=False,
    )
    torch.manual_seed(0)  # the same weights on every rank and for the single process
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=impl, dtype=args.torch_dtype)
    return model.to(args.device).train()


def batches(args: argparse.Namespace) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    shape = (args.batch, args.seq)
    return [torch.randint(0, args.vocab, shape, generator=gen) for _ in range(args.steps)]


def train(ring: bool, args: argparse.Namespace) -> list[float]:
    """`args.steps` SGD steps; ring=True: TokenRing over the default group, else one process."""
    model = build("token_ring" if ring else "sdpa", args)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    losses = []
    for ids in batches(args):
        ids = ids.to(args.device)
        opt.zero_grad(set_to_none=True)
        if ring:
            batch = tr_hf.shard_batch(ids)  # zigzag shards + globally shifted labels
            labels = batch.pop("shift_labels")
            loss = tr_hf.ring_loss(model(**batch).logits, labels)
            loss.backward()
            tr_hf.sync_gradients(model)
        else:
            loss = model(input_ids=ids, labels=ids).loss  # transformers shifts the labels
            loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main(args: argparse.Namespace) -> None:
    args.torch_dtype = getattr(torch, args.dtype)
    if "WORLD_SIZE" in os.environ:  # torchrun
        if args.device == "cuda":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    tr_hf.register()  # attn_implementation="token_ring" over the default group
    ring = train(True, args)
    local = train(False, args)
    world = dist.get_world_size() if dist.is_initialized() else 1
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(
            f"tiny Llama, {args.heads} query / {args.kv_heads} K/V heads, {args.seq} tokens, "
            f"ring {world}, {args.dtype} on {args.device}"
        )
        print("step  TokenRing    one process  |diff|")
        for step, (a, b) in enumerate(zip(ring, local, strict=True)):
            print(f"{step:4d}  {a:.6f}  {b:.6f}  {abs(a - b):.2e}")
        print(f"max |diff| {max(abs(a - b) for a, b in zip(ring, local, strict=True)):.2e}")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    from tokenring_xdit.tools.rank_exit import run_main

    # our errors: one line per rank (LOG_LEVEL=debug: traceback)
    run_main(lambda: main(ARGS), __file__)
