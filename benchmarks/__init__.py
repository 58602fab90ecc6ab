"""The benchmarks users run, by name: `python -m benchmarks <name> [args]` (or, for the multi-GPU
ones, `torchrun --nproc_per_node=N -m benchmarks <name> [args]`); `python -m benchmarks` lists
them. Each entry is a script of this folder that also runs by path. One-off diagnostics that a
committed result depends on are under diagnostics/ (run them by path). Not part of the installed
package; README.md's table is `table_markdown()` (tests/unit/test_benchmarks_entry.py).
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> (how it is launched, what it measures)
SWEEPS: dict[str, tuple[str, str]] = {
    "ring_sweep": (
        "torchrun",
        "one attention call vs tokens: TokenRing vs xDiT's/yunchang's rings and ulysses, time "
        "and exactness (docs/benchmarks/inference-ring-call-h200-2026-11-22/sweep_*.json; "
        "`plan --validate` scores them)",
    ),
    "train_sweep": (
        "torchrun",
        "forward + backward per attention call, causal and non-causal: TokenRing vs yunchang's "
        "rings, torch's templated ring and ulysses (`--check`: gradients vs exact)",
    ),
    "e2e_pipeline": (
        "torchrun",
        "end-to-end denoising latency of random-weight PixArt / Flux: one GPU vs xDiT's ring vs "
        "TokenRing, same weights and seed",
    ),
    "diffusers_cp": (
        "torchrun",
        "diffusers' own context parallelism end to end (Wan 2.1 at 480p x 81 frames, Flux at "
        "2048 px, random weights): TokenRing vs diffusers' ring and ulysses, ms per step and "
        "latents vs one GPU",
    ),
    "profile_ring_call": (
        "torchrun",
        "where one TokenRing call's time goes: kernel time by kind vs the kernels alone",
    ),
    "profile_train_call": (
        "torchrun",
        "where one training call's time goes, per rank: attention, NCCL and merges in the open, "
        "GPU idle, vs the rank's kernels-only ceiling and whole-sequence cuDNN / N",
    ),
    "multi_node_train": (
        "torchrun",
        "training across nodes: forward + backward, causal GQA and non-causal MHA, TokenRing vs "
        "ulysses vs yunchang's K/V rings, every method checked against exact attention",
    ),
    "multi_node": (
        "python",
        "multi-node stand-in on one host: K torchrun launchers with their own NCCL_HOSTID run a "
        "benchmark across the network transport; logs which pairs use P2P and which NET",
    ),
    "packed_varlen": (
        "python",
        "packed documents on one GPU: which block kernel, and what one ring rank costs; "
        "`--real-ring` under `torchrun --nproc_per_node=N`: the real ring per layout (zigzag, "
        "documents, auto) vs the dense causal ring and the per-document ideal / N (`--check`: "
        "out and gradients vs fp64; `--profile N`: per rank the timeline, host issue time, "
        "launches per call and the cost model's ms beside attention busy, `--profile-events` "
        "one call's GPU activities)",
    ),
    "replay_rank": (
        "python",
        "one rank's training work at ring N replayed on one GPU vs whole-sequence cuDNN / N",
    ),
    "ceiling": (
        "python",
        "the kernel ceiling of a ring: the blocks one rank runs, back to back on one GPU, vs the "
        "whole sequence / N (fwd and fwd+bwd; full, causal zigzag, packed documents; `--windows`: "
        "causal sliding windows on zigzag and contiguous shards, each window kernel timed)",
    ),
    "train_ring1": (
        "python",
        "ring degree 1 forward + backward: TokenRing's training path vs SDPA cuDNN and flash",
    ),
    "calibrate_blocks": (
        "python",
        "per-block kernel times for the planner's calibration table (one GPU, < 4 minutes)",
    ),
    "derive_planner_data": (
        "python",
        "rewrites tokenring_xdit/planner/data/ from the committed measurements (no GPU)",
    ),
    "fit_layout_cost": (
        "python",
        "refits the packed-layout cost model `auto` picks with "
        "(tokenring_xdit/ring/packed/data/cost_model.json) from packed_varlen's one-GPU "
        "replays (no GPU)",
    ),
    "plot_sweep": ("python", "plots ring_sweep results: time per call and efficiency vs tokens"),
    "plot_e2e": ("python", "plots e2e_pipeline results: seconds per image per setting"),
    "plot_train_speed": ("python", "plots train_ring1 and replay_rank results side by side"),
    "plot_packed_train_graph": (
        "python",
        "plots packed_varlen --train-graph results: ms per call per step, eager and graphed",
    ),
    "plot_packed_ring": (
        "python",
        "plots packed_varlen --real-ring results: ms per packed layout/kernel, the dense ring, "
        "the per-document ideal",
    ),
    "plot_train_sweep": ("python", "plots train_sweep results: ms per call per method and shape"),
    "plot_multi_node": (
        "python",
        "plots a multi-node stand-in folder: training and forward ms per method per link setting",
    ),
    "plot_before_after": (
        "python",
        "plots one change's effect: new / old time per shape from ring_sweep or train_sweep runs",
    ),
    "plot_window_ceiling": (
        "python",
        "plots ceiling --windows results: the kernel ceiling vs tokens per W, the band kernels' ms",
    ),
}


def script(name: str) -> Path:
    return HERE / f"{name}.py"


def table_markdown() -> str:
    """benchmarks/README.md's table of the entries."""
    rows = ["| name | launch | what it measures |", "|---|---|---|"]
    for name, (launch, what) in SWEEPS.items():
        how = "torchrun --nproc_per_node=N -m" if launch == "torchrun" else "python -m"
        rows.append(f"| `{name}` | `{how} benchmarks {name}` | {what} |")
    return "\n".join(rows) + "\n"
