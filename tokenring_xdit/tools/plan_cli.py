"""`tokenring-xdit plan`: rank every ulysses x ring split and ring for a model on a machine.

The CLI glue over tokenring_xdit/planner (which imports nothing from tools/); registered by
tokenring_xdit/tools/cli.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import config

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..planner.known_models import MODELS
    from .cli_args import positive_int

    p.add_argument("--model", choices=sorted(MODELS), help="known model (heads, dim, layers)")
    p.add_argument("--heads", type=positive_int, help="attention heads (instead of --model)")
    p.add_argument("--head-dim", type=positive_int, help="head size (instead of --model)")
    p.add_argument("--layers", type=positive_int, help="attention calls per forward (model's)")
    p.add_argument("--steps", type=positive_int, help="denoising steps (default: model's)")
    p.add_argument("--batch", type=positive_int, help="batch per call (model's, 2 with CFG)")
    p.add_argument("--tokens", type=positive_int, help="attention sequence length (all ranks)")
    p.add_argument(
        "--resolution", type=positive_int, help="square image side in px (instead of --tokens)"
    )
    p.add_argument("--gpus", type=positive_int, default=2, help="GPUs in all (default 2)")
    p.add_argument("--nodes", type=positive_int, default=1, help="nodes the GPUs are spread over")
    p.add_argument("--fabric", default="nvswitch", choices=config.FABRICS, help="inside a node")
    p.add_argument(
        "--inter-fabric",
        default="ib",
        metavar="LINK",
        help="between nodes: a fabric name (" + ", ".join(config.FABRICS) + "), the JSON of a "
        "link probe (benchmarks/multi_node.py ... nccl_peers.py), or "
        "gbps=G[,latency_us=L][,both_ways_gbps=B] (default ib, nominal)",
    )
    p.add_argument("--gpu", default="NVIDIA H200", help="GPU name as torch reports it")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    p.add_argument("--table", help="calibration table JSON (default: the shipped one for --gpu)")
    p.add_argument("--top", type=positive_int, help="print only the best N rows (default: all)")
    p.add_argument("--plot", metavar="PATH", help="write a bar chart (needs the bench extra)")
    p.add_argument(
        "--validate",
        action="store_true",
        help="predict every committed ring sweep (sweep_*.json) and score the model",
    )
    p.add_argument(
        "--bench-dir",
        help="--validate: folder of sweep_*.json (default: the checkout's "
        "docs/benchmarks/inference-ring-call-h200-2026-11-22, else the copy shipped with the "
        "package)",
    )
    p.add_argument("--verbose", action="store_true", help="--validate: one line per prediction")
    p.add_argument("--causal", action="store_true", help="causal attention (zigzag rings)")
    p.add_argument(
        "--train", action="store_true", help="forward + backward (training) instead of forward"
    )
    p.add_argument("--kv-heads", type=positive_int, help="K/V heads under GQA/MQA (default: heads)")
    p.add_argument(
        "--ceiling",
        action="store_true",
        help="show each split's efficiency and its ring's kernel ceiling (always with --causal or "
        "--train; benchmarks/ceiling.py measures the ceilings the model is fitted to)",
    )


def _shape(args: argparse.Namespace):
    from ..planner.known_models import MODELS, ModelSpec, tokens_for

    if args.model:
        spec = MODELS[args.model]
    elif args.heads and args.head_dim:
        spec = ModelSpec("custom", args.heads, args.head_dim, 1, 1)
    else:
        raise ValueError("give --model, or --heads and --head-dim")
    if args.tokens:
        tokens = args.tokens
    elif args.resolution:
        if args.resolution < spec.patch_px:
            raise ValueError(
                f"--resolution {args.resolution} is below one {spec.patch_px} px patch"
            )
        tokens = tokens_for(spec, args.resolution)
    else:
        raise ValueError("give --tokens (total sequence length) or --resolution")
    if args.gpus % args.nodes:  # make_machine says the same, but only after numpy and scipy load
        raise ValueError(f"--gpus {args.gpus} must be a positive multiple of --nodes {args.nodes}")
    if tokens < args.gpus:
        raise ValueError(f"--tokens {tokens} leaves some of the {args.gpus} GPUs without a token")
    layers = args.layers or spec.layers
    steps = args.steps or spec.steps
    batch = args.batch or spec.batch
    return spec, tokens, layers, steps, batch


def _opt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _fail(message: str) -> int:
    from .cli_args import EXIT_USAGE, print_usage_error

    print_usage_error("plan", message)
    return EXIT_USAGE


_NO_MATPLOTLIB = "--plot needs matplotlib: pip install 'tokenring-xdit[bench]'"


def _plot(path: str, choices, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError(_NO_MATPLOTLIB) from exc
    labels = [c.label for c in choices][::-1]
    values = [c.per_step_ms for c in choices][::-1]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(labels) + 1.5))
    ax.barh(labels, values, color=["#4c72b0"] * (len(values) - 1) + ["#dd8452"])
    ax.set_xlabel("predicted attention ms per denoising step")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _say_best(choices, why: str, args, spec, tokens: int, batch: int) -> None:
    """The best split, why, what travels round its ring in training (the call's
    `travel="auto"` picks it from the same shapes), and how to run it."""
    from ..planner.plan import diffusers_config, xdit_flags

    best = choices[0]
    print(f"best: {best.label}")
    print(f"  why: {why}")
    ring = next((c for c in choices if c.prediction.ring > 1), None)  # the best with a ring
    if args.train and ring is not None:
        from ..planner.kv_both_ways import TrainShape, choose_travel

        p, kv = ring.prediction, args.kv_heads or spec.heads
        shape = TrainShape(batch * spec.heads // p.ulysses, batch * kv // p.ulysses,
                           spec.head_dim, tokens // p.ring, args.causal)  # fmt: skip
        pick, said = choose_travel(shape, p.ring, args.fabric)
        moved = "K/V both ways" if pick == "kv" else "queries"
        print(f"  travel:    {moved} round {ring.label}'s ring ({said})")
    print(f"  xDiT:      {xdit_flags(best)}")
    print(f"  diffusers: {diffusers_config(best)}")


def _validate(args: argparse.Namespace) -> int:
    from ..planner.validate import default_bench_dir, report
    from ..planner.validate_train import training_lines

    try:
        text, ok = report(args.bench_dir, verbose=args.verbose)
    except FileNotFoundError as exc:
        return _fail(str(exc))
    # the training model's score beside the forward one, before the summary line (the forward
    # target's; training is not part of it)
    *body, summary = text.splitlines()
    train = training_lines(args.bench_dir or default_bench_dir(), verbose=args.verbose)
    print("\n".join([*body, *train, summary]))
    return 0 if ok else 1


def run(args: argparse.Namespace) -> int:
    if args.validate:
        return _validate(args)
    if args.plot:  # refused before the table, not after it
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return _fail(_NO_MATPLOTLIB)
    try:  # the arguments first: the planner's modules load numpy and scipy
        spec, tokens, layers, steps, batch = _shape(args)
    except ValueError as exc:
        return _fail(str(exc))
    from ..planner.calibration import load_table
    from ..planner.machine import make_machine
    from ..planner.plan import rank_all, reason
    from ..planner.workload import Workload

    try:
        table = load_table(args.gpu, args.table)
        m = make_machine(args.gpus, args.nodes, args.fabric, args.inter_fabric, args.gpu, table)
        workload = Workload(causal=args.causal, train=args.train)
        choices = rank_all(
            m, spec.heads, spec.head_dim, tokens, layers=layers, batch=batch, dtype=args.dtype,
            kv_heads=args.kv_heads, workload=workload,
        )  # fmt: skip
    except (ValueError, FileNotFoundError) as exc:
        return _fail(str(exc))
    src = "derived (not measured)" if table.derived else "measured"
    if table.meta.get("fallback_for"):
        print(
            f"tokenring-xdit plan: warning: no kernel table for {args.gpu!r}: predicting with "
            f"{table.gpu}'s ({Path(table.path).name}); time one with "
            "benchmarks/calibrate_blocks.py on that GPU and pass --table",
            file=sys.stderr,
        )
        src += f", {table.gpu}'s: none for {args.gpu}"
    print(f"{spec.name}: {spec.heads} heads x {spec.head_dim}, {tokens} tokens, batch {batch}, "
          f"{layers} attention layers x {steps} steps")  # fmt: skip
    print(f"machine: {m.describe()}; kernel table {Path(table.path).name} ({src})")
    if tokens % args.gpus:
        print(f"note: {tokens} tokens do not split evenly over {args.gpus} GPUs (padding needed)")
    ceilings = args.ceiling or not workload.simulated
    if not workload.simulated:
        print(f"workload: {workload.label} (TokenRing and ulysses; planner/workload.py)")
    extra = f" {'eff':>6} {'ceiling':>7}" if ceilings else ""
    print(f"{'#':>2} {'split':36} {'ms/call':>9} {'ms/step':>9} {'s/image':>8}{extra}  gpu/host ms")
    shown = choices[: args.top] if args.top else choices
    for i, c in enumerate(shown, 1):
        p = c.prediction
        cols = f" {c.efficiency:6.3f} {_opt(c.ceiling):>7}" if ceilings else ""
        print(
            f"{i:2} {c.label:36} {p.ms:9.3f} {c.per_step_ms:9.2f} "
            f"{c.per_step_ms * steps / 1e3:8.3f}{cols}  {p.gpu_ms:.3f}/{p.host_ms:.3f}"
        )
    _say_best(choices, reason(choices, tokens, workload), args, spec, tokens, batch)
    if args.plot:
        try:
            _plot(args.plot, shown, f"{spec.name} {tokens} tokens, {m.describe()}")
        except RuntimeError as exc:
            return _fail(str(exc))
        print(f"wrote {args.plot}")
    return 0
