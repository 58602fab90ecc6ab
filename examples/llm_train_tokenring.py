"""Train a tiny Llama-style model with sequence parallelism: TokenRing vs another ring vs 1 process.

Random weights and tokens, no download. Each rank holds the shard of every sequence that
yunchang's `EXTRACT_FUNC_DICT[ring_impl]` gives it (zigzag chunks r and 2N-1-r for TokenRing),
runs causal attention through yunchang's `LongContextAttention` (ulysses x ring), and the
parameter gradients are summed over the sequence-parallel ranks before each optimizer step.

    # CPU, 2 ranks (gloo), TokenRing, also the same steps in one process for comparison
    torchrun --nproc-per-node 2 examples/llm_train_tokenring.py --impl token_ring --compare
    # GPUs: yunchang's own zigzag ring (needs flash-attn), ulysses 2 x ring 2
    torchrun --nproc-per-node 4 examples/llm_train_tokenring.py --impl zigzag --ulysses 2

Prints the loss of every step (and, with --compare, the single-process loss and the largest
parameter-gradient difference of the first step).
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="token_ring", help="yunchang ring_impl_type or 'local'")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--ulysses", type=int, default=1)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--compare", action="store_true", help="also run 1 process and diff")
    from tokenring_xdit.tools.rank_exit import one_line_usage_errors

    return one_line_usage_errors(parser).parse_args()


# Run as a script, the arguments parse before torch loads (seconds, tens on a busy machine): a
# bad flag or --help answers at once.
ARGS = parse() if __name__ == "__main__" else None

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402


@dataclass(frozen=True)
class TinyConfig:
    vocab: int = 128
    dim: int = 64
    heads: int = 4
    layers: int = 2
    ffn: int = 128
    rope_base: float = 10000.0


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary embedding of x (b, s, h, d) at GLOBAL positions (b, s): shards keep their own."""
    half = x.shape[-1] // 2
    freqs = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = positions.float().unsqueeze(-1) * freqs  # (b, s, half)
    cos, sin = angles.cos().unsqueeze(2).to(x.dtype), angles.sin().unsqueeze(2).to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Block(nn.Module):
    def __init__(self, cfg: TinyConfig, attn):
        super().__init__()
        self.cfg, self.attn = cfg, attn
        self.norm1, self.norm2 = RMSNorm(cfg.dim), RMSNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.gate_up = nn.Linear(cfg.dim, 2 * cfg.ffn, bias=False)
        self.down = nn.Linear(cfg.ffn, cfg.dim, bias=False)

    def forward(self, x, positions):
        b, s, _ = x.shape
        head_dim = self.cfg.dim // self.cfg.heads
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.cfg.heads, head_dim).unbind(2)
        q, k = rope(q, positions, self.cfg.rope_base), rope(k, positions, self.cfg.rope_base)
        x = x + self.proj(self.attn(q, k, v).reshape(b, s, -1))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class TinyLlama(nn.Module):
    """attn(q, k, v) -> out, all (b, s_local, h, d), causal over the GLOBAL sequence."""

    def __init__(self, cfg: TinyConfig, attn):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg, attn) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, tokens, positions):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, positions)
        return self.head(self.norm(x))


def local_attention(q, k, v):
    """One process: causal SDPA over the whole sequence."""
    out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
    return out.transpose(1, 2)


def _attn_type(device: torch.device, dtype: torch.dtype):
    from yunchang.kernels import AttnType

    if device.type == "cpu":
        return AttnType.TORCH_MATH  # TokenRing runs torch's CPU flash kernel (exact lse) for it
    if dtype == torch.float32:
        return AttnType.TORCH_MATH  # torch's CUDA flash kernels are half-precision only
    import importlib.util

    return AttnType.FA if importlib.util.find_spec("flash_attn") else AttnType.TORCH_FLASH


def sp_attention(impl: str, device: torch.device, dtype: torch.dtype = torch.float32):
    """yunchang's ulysses x ring layer with ring `impl`, as attn(q, k, v) (causal)."""
    from yunchang import LongContextAttention

    layer = LongContextAttention(ring_impl_type=impl, attn_type=_attn_type(device, dtype))
    return lambda q, k, v: layer(q, k, v, causal=True)


def batch(steps: int, b: int, seq: int, vocab: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (b, seq + 1), generator=gen) for _ in range(steps)]


def train(
    impl: str,
    steps: int = 3,
    seq: int = 64,
    b: int = 2,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    ulysses: int = 1,
    lr: float = 0.5,
    cfg: TinyConfig | None = None,
) -> dict:
    """Run `steps` SGD steps; impl "local" = one process, else a yunchang ring_impl_type.

    Returns {"losses": [...], "grads": {name: first-step gradient (full, fp32, cpu)}}.
    Distributed: torch.distributed must be initialised; every rank gets the same result.
    """
    cfg = cfg or TinyConfig()
    dev = torch.device(device)
    torch.manual_seed(1234)  # the same weights on every rank and in the single process
    if impl == "local":
        attn, shard, world = local_attention, (lambda x: x), 1
    else:
        from yunchang import EXTRACT_FUNC_DICT, set_seq_parallel_pg

        world, rank = dist.get_world_size(), dist.get_rank()
        set_seq_parallel_pg(ulysses, world // ulysses, rank, world)
        extract = EXTRACT_FUNC_DICT[impl]

        def shard(x):
            return extract(x, rank, world_size=world, rd=world // ulysses, ud=ulysses)

        attn = sp_attention(impl, dev, dtype)
    model = TinyLlama(cfg, attn).to(dev, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, first_grads = [], {}
    for tokens in batch(steps, b, seq, cfg.vocab):
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        positions = torch.arange(seq).expand(b, seq)
        inputs, labels, positions = (shard(x).to(dev) for x in (inputs, labels, positions))
        logits = model(inputs, positions)
        # sum over local tokens / ALL tokens: summing the ranks' gradients gives the full one
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="sum")
        loss = loss / (b * seq)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        loss = loss.detach()
        if world > 1:
            dist.all_reduce(loss)
            for p in model.parameters():
                dist.all_reduce(p.grad)
        if not first_grads:
            first_grads = {n: p.grad.float().cpu().clone() for n, p in model.named_parameters()}
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "grads": first_grads}


def compare(ring: dict, local: dict) -> dict:
    """Largest per-step loss difference and largest first-step parameter-gradient difference."""
    loss_err = max(abs(a - b) for a, b in zip(ring["losses"], local["losses"], strict=True))
    grad_err = max((ring["grads"][n] - g).abs().max().item() for n, g in local["grads"].items())
    return {"max_loss_err": loss_err, "max_grad_err": grad_err}


def main(args: argparse.Namespace) -> None:
    import tokenring_xdit

    tokenring_xdit.install()  # registers ring_impl_type="token_ring" (automatic when installed)
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
    distributed = "WORLD_SIZE" in os.environ and args.impl != "local"
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
    device = f"cuda:{local_rank}" if cuda else "cpu"
    dtype = getattr(torch, args.dtype)
    kwargs = dict(steps=args.steps, seq=args.seq, b=args.batch, dtype=dtype, device=device)
    result = train(args.impl, ulysses=args.ulysses, **kwargs)
    rank0 = not distributed or dist.get_rank() == 0
    reference = train("local", **kwargs) if args.compare else None
    if rank0:
        for step, loss in enumerate(result["losses"]):
            line = f"step {step}: loss {loss:.6f} ({args.impl})"
            if reference:
                line += f"  1 process {reference['losses'][step]:.6f}"
            print(line, flush=True)
        if reference:
            print(compare(result, reference), flush=True)
        print(f"(uniform-random tokens: loss starts near ln(vocab) = {math.log(128):.3f})")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    from tokenring_xdit.tools.rank_exit import run_main

    # our errors: one line per rank (LOG_LEVEL=debug: traceback)
    run_main(lambda: main(ARGS), __file__)
