"""The result tables of README.md and docs/performance.md, rebuilt from the committed JSON under
docs/benchmarks/ (tests/unit/test_doc_results.py requires every line built here to be on its
page, so a quoted number cannot drift from its evidence)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "docs" / "benchmarks"

# ring_sweep.py's columns, in the order the tables show them
SWEEP_METHODS = {
    "ulysses_ms": "ulysses",
    "torch_ag_ms": "torch all-gather (xDiT)",
    "torch_a2a_ms": "torch all-to-all",
    "yunchang_p2p_ms": "yunchang P2P",
}
RINGS = ("torch_ag_ms", "torch_a2a_ms", "yunchang_p2p_ms")  # the other rings
TRAIN_OTHER_RINGS = ("yunchang_zigzag", "yunchang_basic", "torch_templated_ring_cudnn")


def load(rel: str):
    data = json.loads((BENCH / rel).read_text())
    return data["rows"] if isinstance(data, dict) and "rows" in data else data


def ms(x: float) -> str:
    """Call times as the pages write them: 3 significant figures from 1 ms, 3 decimals below."""
    if x >= 100:
        return f"{x:.1f}"
    return f"{x:.2f}" if x >= 10 else f"{x:.3f}"


def ratio(x: float) -> str:
    return f"{x:.2f}"


def _shape(row: dict) -> str:
    return f"{row['model']} {row['tokens']}"


def sweep_table(rel: str) -> list[str]:
    """One attention call per shape: ideal, TokenRing (graphed, its efficiency), every other
    method; the fastest in bold."""
    rows = load(rel)
    cols = [c for c in SWEEP_METHODS if c in rows[0]]
    head = ["shape", "ideal (1 GPU / N)", "TokenRing", "efficiency"] + [
        SWEEP_METHODS[c] for c in cols
    ]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        times = {c: r[c] for c in ["token_ring_ms", *cols]}
        best = min(times, key=times.get)
        cell = {c: (f"**{ms(v)}**" if c == best else ms(v)) for c, v in times.items()}
        eff = ratio(r["ideal_ms"] / r["token_ring_ms"])
        line = [_shape(r), ms(r["ideal_ms"]), cell["token_ring_ms"], eff] + [cell[c] for c in cols]
        out.append("| " + " | ".join(line) + " |")
    return out


def p2p_off_table() -> list[str]:
    """Host-staged (NCCL_P2P_DISABLE=1): TokenRing against the best other ring and ulysses."""
    base = "inference-ring-call-h200-2026-11-22/"
    two = {_shape(r): r for r in load(base + "sweep_2xH200_p2p_off.json")}
    four = {_shape(r): r for r in load(base + "sweep_4xH200_p2p_off.json")}
    head = ["shape", "ring 2: TokenRing", "best other ring", "ulysses 2", "ring 4: TokenRing",
            "best other ring", "ulysses 4"]  # fmt: skip
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape, r2 in two.items():
        r4 = four[shape]
        cells = [shape]
        for r in (r2, r4):
            other = min(r[c] for c in RINGS)
            cells += [ms(r["token_ring_ms"]), ms(other), ms(r["ulysses_ms"])]
        out.append("| " + " | ".join(cells) + " |")
    return out


def transport_table() -> list[str]:
    """CUDA-IPC against NCCL between two GPUs, graphed TokenRing calls."""
    base = "ipc-vs-nccl-2xh100-2026-11-25/"
    nccl, ipc = load(base + "sweep_nccl.json"), load(base + "sweep_ipc.json")
    out = ["| shape | NCCL | IPC | IPC / NCCL |", "|---|---|---|---|"]
    for a, b in zip(nccl, ipc, strict=True):
        t_a, t_b = a["token_ring_ms"], b["token_ring_ms"]
        out.append(f"| {_shape(a)} | {ms(t_a)} | {ms(t_b)} | {ratio(t_b / t_a)} |")
    return out


OLD, NEW = "end-to-end-h200-2026-11-22/", "inference-ring2-ring4-h200-2026-11-26/"
E2E = [  # (label, file, image size)
    ("PixArt-alpha 1024 px, 2 GPUs", OLD + "e2e_pixart_2xH200.json", 1024),
    ("PixArt-alpha 2048 px, 2 GPUs", NEW + "e2e_pixart2048_final_a.json", 2048),
    ("Flux.1-dev 2048 px, 2 GPUs", NEW + "e2e_flux2048.json", 2048),
    ("Flux.1-dev 2048 px, ring 4", OLD + "e2e_flux_4xH200_ring4.json", 2048),
    ("Flux.1-dev 2048 px, ulysses 2 x ring 2", OLD + "e2e_flux_4xH200_u2r2.json", 2048),
]
E2E_COLS = ("one_gpu_s", "xdit_default_s", "xdit_default_graph_s", "xdit_token_ring_s",
            "xdit_token_ring_graph_s")  # fmt: skip


def e2e_row(rel: str, size: int) -> dict:
    return next(r for r in load(rel) if r["size"] == size)


def e2e_table() -> list[str]:
    head = ["seconds per image (20 steps)", "1 GPU", "xDiT ring", "xDiT ring + graph", "TokenRing",
            "TokenRing + graph"]  # fmt: skip
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, rel, size in E2E:
        r = e2e_row(rel, size)
        times = {c: r[c] for c in E2E_COLS[1:]}
        best = min(times, key=times.get)
        cells = [label, f"{r['one_gpu_s']:.2f}" if "one_gpu_s" in r else "-"]
        cells += [f"**{times[c]:.3f}**" if c == best else f"{times[c]:.3f}" for c in E2E_COLS[1:]]
        out.append("| " + " | ".join(cells) + " |")
    return out


def _train(rel: str) -> dict:
    return {(r["heads"], r["seq"], r["causal"], r["impl"]): r["ms"] for r in load(rel)}


def train_table() -> list[str]:
    """Forward + backward per call at rings 1, 2, 4 and ulysses 2 x ring 2 (same machine)."""
    base = "training-ring2-ring4-h200-2026-11-26/"
    one, two = _train(base + "train_ring1.json"), _train(base + "train_ring2.json")
    four, u2r2 = _train(base + "train_ring4.json"), _train(base + "train_u2r2.json")
    head = ["heads", "tokens", "mask", "1 GPU", "TokenRing ring 2", "efficiency", "ulysses 2",
            "TokenRing ring 4", "ulysses 4", "best other ring 4", "TokenRing 2 x 2"]  # fmt: skip
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for heads in (32, 64):
        for seq in (16384, 32768):
            for causal in (True, False):
                k = (heads, seq, causal)
                ref = min(v for (h, s, c, _), v in one.items() if (h, s, c) == k)
                other = min(four[(*k, m)] for m in TRAIN_OTHER_RINGS)
                cells = [str(heads), str(seq), "causal" if causal else "full", ms(ref),
                         ms(two[(*k, "token_ring")]), ratio(ref / 2 / two[(*k, "token_ring")]),
                         ms(two[(*k, "ulysses")]), ms(four[(*k, "token_ring")]),
                         ms(four[(*k, "ulysses")]), ms(other),
                         ms(u2r2[(*k, "token_ring")])]  # fmt: skip
                out.append("| " + " | ".join(cells) + " |")
    return out


def train_graph_table() -> list[str]:
    rows = load("training-ring4-h200-2026-11/train_graph_ring4.json")
    t = {(r["shape"], r["seq"], r["impl"]): r["ms"] for r in rows}
    out = ["| shape | tokens | TokenRing eager | TokenRing graphed | ulysses 4 |",
           "|---|---|---|---|---|"]  # fmt: skip
    names = {"gqa-32-8": "causal GQA 32/8", "mha-32": "non-causal MHA 32"}
    for shape, label in names.items():
        for seq in (16384, 32768):
            cells = [label, str(seq)] + [ms(t[(shape, seq, m)]) for m in
                                         ("token_ring", "token_ring_graph", "ulysses")]  # fmt: skip
            out.append("| " + " | ".join(cells) + " |")
    return out


def _steps(values: list[float]) -> str:
    return ", ".join(ms(v) for v in values)


def new_packing_table() -> list[str]:
    """Packed training with a new packing per step (16 layers, flash_varlen, eager): ms a call
    in each of 3 steps, the contiguous layout against the zigzag."""
    base = "packed-new-packing-h200-2026-11-27/"
    out = [
        "| ring | tokens | contiguous | zigzag | mean contiguous / zigzag |",
        "|---|---|---|---|---|",
    ]
    for rel in ("train_bc.json", "ring2_new_packing.json"):
        for r in load(base + rel):
            c, z = r["methods"]["contiguous"], r["methods"]["zigzag"]
            cells = [str(r["ring"]), str(r["tokens"]), _steps(c["eager_ms_per_call"]),
                     _steps(z["eager_ms_per_call"]),
                     ratio(c["eager_ms"] / z["eager_ms"])]  # fmt: skip
            out.append("| " + " | ".join(cells) + " |")
    return out


PACKED_METHODS = ("zigzag/cudnn", "zigzag/flash_varlen", "contiguous/cudnn",
                  "contiguous/flash_varlen", "dense_causal")  # fmt: skip


def packed_plans_built_table() -> list[str]:
    """A packing run again and again (cuDNN's plans built): slowest rank's ms, (efficiency)."""
    base = "packed-new-packing-h200-2026-11-27/"
    files = (("ring4_packed.json", "as drawn"), ("ring4_bc.json", "balanced"),
             ("ring2_bc.json", "balanced"))  # fmt: skip
    head = ["ring, tokens, order", "zigzag cuDNN", "zigzag flash_varlen", "contiguous cuDNN",
            "contiguous flash_varlen", "dense causal ring"]  # fmt: skip
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rel, order in files:
        for r in load(base + rel):
            m = r["methods"]
            cells = [f"{r['ring']}, {r['tokens']}, {order}"]
            for name in PACKED_METHODS:
                e = m[name]
                cells.append(ms(e["ms"]) if name == "dense_causal" else
                             f"{ms(e['ms'])} ({ratio(e['efficiency'])})")  # fmt: skip
            out.append("| " + " | ".join(cells) + " |")
    return out


def new_packing_kernels_table() -> list[str]:
    """cuDNN per segment against flash_varlen when every step brings a new packing."""
    rows = load("packed-new-packing-h200-2026-11-27/packed_kernels_16.json")
    out = ["| tokens | kernel | eager, new packing | eager, plans built |", "|---|---|---|---|"]
    for r in rows:
        for name in ("zigzag/cudnn", "zigzag/flash_varlen"):
            steps = r["methods"][name]["eager_ms_per_call"]
            new = [steps[0], steps[2]]  # step 1 ran the warm-up's packing
            cells = [str(r["tokens"]), name.split("/")[1], _steps(new), ms(steps[1])]
            out.append("| " + " | ".join(cells) + " |")
    return out


def pieces_table() -> list[str]:
    """The last return in 1-16 pieces (graphed calls, ms)."""
    out = ["| ring | shape | 1 piece | 2 | 4 | 8 | 16 |", "|---|---|---|---|---|---|---|"]
    for rel in ("final_chunks_2of4xH200.json", "final_chunks_4xH200.json"):
        for r in load("last-return-pieces-h200-2026-11-22/" + rel):
            t = [r[f"chunks_{n}_ms"] for n in (1, 2, 4, 8, 16)]
            best = min(t)
            cells = [str(r["ring"]), _shape(r)] + [
                f"**{ms(x)}**" if x == best else ms(x) for x in t
            ]
            out.append("| " + " | ".join(cells) + " |")
    return out


def _sweep_row(rel: str, model: str, tokens: int) -> dict:
    return next(r for r in load(rel) if (r["model"], r["tokens"]) == (model, tokens))


def _fastest_other(r: dict) -> tuple[str, float]:
    name = min((c for c in SWEEP_METHODS if c in r), key=r.get)
    return SWEEP_METHODS[name].split(" (")[0], r[name]


def readme_rows() -> list[tuple[str, str, str]]:
    """(the row's first cell, the TokenRing cell, the fastest-other cell) of README's table."""
    rows = []
    inf = "inference-ring2-ring4-h200-2026-11-26/"
    for label, rel, model, tokens in (
        ("One call, ring 2, Flux 2048 px (16896 tokens)", "sweep_r2.json", "flux", 16896),
        ("One call, ring 2, PixArt 1024 px (4096 tokens)", "sweep_r2.json", "pixart", 4096),
        ("One call, ring 4, Flux 2048 px (16896 tokens)", "sweep_r4.json", "flux", 16896),
        ("One call, ulysses 2 x ring 2, Flux 2048 px", "sweep_u2r2.json", "flux", 16896),
    ):
        r = _sweep_row(inf + rel, model, tokens)
        name, t = _fastest_other(r)
        rows.append((label, f"{ms(r['token_ring_ms'])} ms", f"{name} {ms(t)} ms"))
    for label, rel, size in E2E[1:4]:
        r = e2e_row(rel, size)
        rows.append((f"End to end, {label}", f"{r['xdit_token_ring_graph_s']:.2f} s",
                     f"xDiT ring {r['xdit_default_graph_s']:.2f} s"))  # fmt: skip
    two = _train("training-ring2-ring4-h200-2026-11-26/train_ring2.json")
    k = (32, 32768, True)
    rows.append(("Training, ring 2, causal, 32 heads, 32k tokens",
                 f"{ms(two[(*k, 'token_ring')])} ms",
                 f"ulysses {ms(two[(*k, 'ulysses')])} ms"))  # fmt: skip
    g = {(r["shape"], r["seq"], r["impl"]): r["ms"]
         for r in load("training-ring4-h200-2026-11/train_graph_ring4.json")}  # fmt: skip
    rows.append(("Training, ring 4, causal GQA 32/8, 16k tokens",
                 f"{ms(g[('gqa-32-8', 16384, 'token_ring_graph')])} ms",
                 f"ulysses {ms(g[('gqa-32-8', 16384, 'ulysses')])} ms"))  # fmt: skip
    for rel, ring in (("train_bc.json", 4), ("ring2_new_packing.json", 2)):
        r = load("packed-new-packing-h200-2026-11-27/" + rel)[0]
        c, z = r["methods"]["contiguous"]["eager_ms"], r["methods"]["zigzag"]["eager_ms"]
        rows.append((f"Packed training, ring {ring}, 32k tokens, new packing per step",
                     f"{ms(c)} ms", f"zigzag layout {ms(z)} ms"))  # fmt: skip
    net = {
        (r["shape"], r["seq"], r["impl"]): r["ms"]
        for r in load("across-nodes-standin-2xh200-2026-11-26/train_socket_default.json")
    }
    other = min(
        v for (s, n, m), v in net.items() if (s, n) == ("mha-32", 65536) and m != "token_ring"
    )
    name = next(m for (s, n, m), v in net.items() if (s, n) == ("mha-32", 65536) and v == other)
    rows.append(("Training across 2 nodes (sockets), MHA 32 heads, 64k tokens",
                 f"{ms(net[('mha-32', 65536, 'token_ring')])} ms",
                 f"{name} {ms(other)} ms"))  # fmt: skip
    return rows


def mean(values: list[float]) -> float:
    return statistics.fmean(values)
