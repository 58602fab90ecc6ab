"""How fast is one merge of two attention partials? The Triton merge (ring/merge/fused.py) vs the
torch-op merge vs plain copies scaled to as many bytes (the memory-bandwidth reference), one GPU.

  python benchmarks/diagnostics/merge_bandwidth.py --out $OUT/merge_bandwidth.json \
      [--old path/to/an/older/fused_merge.py]

GPU time per merge, replayed from a CUDA graph as in the ring. Shapes: the partials a ring-2
rank merges at DiT shapes (half its queries: the held-back split makes two such merges per
call), in (b, h, s, d) storage and in (b, s, h, d) storage (xDiT's since the wire layout).
`--old`: time another version of the kernel file beside it (e.g. the merge before its
16-byte accesses). TUNING: queries per program and warps tried beside the default.
"""

from __future__ import annotations

import argparse
import importlib.util
import json

import torch

from tokenring_xdit.ring.merge.partials import fused as fused_merge
from tokenring_xdit.ring.tensor_layout import BHSD
from tokenring_xdit.ring.merge.partials import PartialMerge

# (name, batch, heads, merged queries, head size): ring 2, half of a rank's queries
SHAPES = [
    ("pixart-2048px-cfg", 2, 16, 4096, 72),  # PixArt 2048 px, CFG batch, 8192 local queries
    ("pixart-16384", 1, 16, 4096, 72),
    ("flux-16896", 1, 24, 4224, 128),
    ("flux-32768", 1, 24, 8192, 128),
]


# (queries per program, warps) tried beside the default
TUNING = [(s, w) for s in (16, 32, 64, 128) for w in (2, 4, 8)]


def _time_us(fn, per_graph: int = 20, replays: int = 10) -> float:
    """GPU time of one fn() call: `per_graph` calls captured in a CUDA graph, replayed (the
    merges run inside graphs in the ring, so the Triton launcher's host time is left out)."""
    fn()  # compile / warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_graph):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (replays * per_graph) * 1e3


def _load(path: str):
    spec = importlib.util.spec_from_file_location("old_fused_merge", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(name: str, dims: tuple, storage: str, kernels: dict, gen) -> dict:
    """One shape in one storage order: every kernel, the tuning grid, torch ops and the copy."""
    b, h, s, d = dims
    shape = dims if storage == "bhsd" else (b, s, h, d)

    def make():
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
        return x if storage == "bhsd" else x.transpose(1, 2)  # (b, h, s, d) views

    a, other, dst = make(), make(), make()
    la, lb = (torch.randn(b, h, s, device="cuda", generator=gen) for _ in "ab")
    lo = torch.empty_like(la)
    args = (dst, lo, a, la, other, lb)
    moved = 3 * a.numel() * a.element_size() + 3 * la.numel() * 4  # read 2, write 1
    row = {"shape": name, "storage": storage, "b": b, "h": h, "s": s, "d": d,
           "mbytes": round(moved / 1e6, 2)}  # fmt: skip
    for label, module in kernels.items():
        row[f"{label}_us"] = round(_time_us(lambda m=module: m.merge2_bhsd(*args)), 2)
    for block_s, warps in TUNING:
        us = _time_us(
            lambda bs=block_s, w=warps: fused_merge.merge2_bhsd(*args, block_s=bs, num_warps=w)
        )
        row[f"triton_s{block_s}_w{warps}_us"] = round(us, 2)
    merge = PartialMerge(a, la, BHSD, torch.bfloat16, updates=1, fused=False)
    row["torch_ops_us"] = round(_time_us(lambda: merge._merge(*args)), 2)
    row["copy_us"] = round(_time_us(lambda: (dst.copy_(a), dst.copy_(other))) * 0.75, 2)
    row["triton_tb_s"] = round(moved / row["triton_us"] / 1e6, 2)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--old", help="another fused_merge.py to time beside this one")
    args = ap.parse_args()
    kernels = {"triton": fused_merge}
    if args.old:
        kernels["triton_old"] = _load(args.old)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for name, b, h, s, d in SHAPES:
        for storage in ("bhsd", "bshd"):
            row = _row(name, (b, h, s, d), storage, kernels, gen)
            rows.append(row)
            print(row, flush=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "command": "python benchmarks/diagnostics/merge_bandwidth.py"
            + (" --old OLD" if args.old else "")}  # fmt: skip
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
