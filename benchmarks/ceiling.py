"""The kernel ceiling of a ring: the block kernels ONE rank runs, back to back on ONE GPU.

    python -m benchmarks ceiling --out ceiling.json
    python -m benchmarks ceiling --tokens 16384,32768 --rings 2,4,8 --heads 32 --kv-heads 8,32

For each shape (tokens S, heads, K/V heads, head dim, batch), ring degree N, mask and pass, the
probe takes the blocks one rank runs from the schedules the ring itself runs (`rank_blocks`:
the inference forward's table with its held-back own block and last pieces for a non-causal
forward, `CAUSAL_ZIGZAG` / `NON_CAUSAL_BLOCKS` block steps for training and causal calls,
`documents.doc_plan` for packed documents), runs them with the kernel the ring would resolve
(`resolve_kernel`: cuDNN through SDPA on H100/H200, the varlen kernel for documents) and times
them back to back. Transfers, merges and every other op are free, so no ring schedule can beat
it with these kernels:

    ceiling = (one-GPU time of the whole sequence / N) / (busiest rank's kernels-only time)

The block lists are `tokenring_xdit.planner.ceiling.rank_blocks` (the planner predicts ceilings
from the same lists). The one-GPU time is the same kernel on the whole sequence (the ring's own
N = 1 call). Masks: `full` (non-causal), `causal` (zigzag), `packed` (causal documents on
zigzag shards; the lengths from --docs) and `packed-full` (non-causal documents). Passes: `fwd`
and `fwd+bwd`. `ceiling()` is the pure entry other benchmarks call; on the CPU it runs with the
exact kernels (tests).

Sliding windows (`--windows 128,1024,4096`: causal windows window_size=(W - 1, 0), in place of
--masks): the blocks are the window plan's (ring/packed/window_plan.py) on `--splits` zigzag and
contiguous shards, run by the record a windowed call resolves (kernels/window.py: the call's
kernel for blocks the window left alone, torch's flash op with its window arguments for banded
segments); each row adds the busiest rank's calls and ms per kernel (`kernels`). The one-GPU time
is the fastest whole-sequence window kernel (`whole_kernels_ms`: flash's window with K/V expanded
or grouped, flex_attention compiled, the exact kernel where small; _window_kernels.py), and the
busiest rank's banded segments are timed on each of them too (`band_kernels_ms`; each distinct
segment once, in the file's `bands`).

    python -m benchmarks ceiling --windows 128,1024,4096 --tokens 32768,65536,131072,262144,524288 \
        --rings 4,8 --kv-heads 8 --out window_ceiling.json
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from tokenring_xdit.planner.ceiling import BlockRun, rank_blocks, uses_block_steps

__all__ = ["BlockRun", "ceiling", "documents_of", "main", "rank_blocks", "uses_block_steps"]

MASKS = ("full", "causal", "packed", "packed-full")
PASSES = ("fwd", "fwd+bwd")
SPLITS = ("zigzag", "contiguous")  # a windowed causal call's shards (ring/packed/doc_split.py)
KERNELS = ("flash_varlen", "flash_varlen_gqa", "masked", "flex")  # _window_kernels.KERNELS


def documents_of(spec: str, total: int, seed: int = 0):
    """Documents of `total` tokens from --docs: `exp:MEAN` (exponential lengths, seeded),
    `fixed:LEN`, or `cu:0,b1,...,total` (cu_seqlens)."""
    from tokenring_xdit.ring.packed import Documents

    kind, _, arg = spec.partition(":")
    if kind == "cu":
        return Documents.of([int(x) for x in arg.split(",")], total)
    if kind not in ("exp", "fixed"):
        raise ValueError(f"--docs {spec!r}: use exp:MEAN, fixed:LEN or cu:0,...,total")
    mean, rng, bounds = int(arg), random.Random(seed), [0]
    while bounds[-1] < total:
        length = mean if kind == "fixed" else max(1, round(rng.expovariate(1 / mean)))
        bounds.append(min(total, bounds[-1] + length))
    return Documents.of(bounds, total)


def _timed(fn, device: torch.device, warmup: int, iters: int, budget_ms: float) -> float:
    """Median ms of fn(); after the warm-up, as many runs as fit `budget_ms` (1..iters)."""

    def once() -> float:
        if device.type != "cuda":
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        return begin.elapsed_time(end)

    first = [once() for _ in range(max(1, warmup))][-1]
    runs = max(1, min(iters, int(budget_ms // max(first, 1e-3))))
    return statistics.median(once() for _ in range(runs))


class _Rank:
    """One rank's tensors and its kernel calls (the ring's record or block kernel): a fresh
    query (and dO) per call, as the ring holds a new one each step; the local K/V once, its
    front half a view (the zigzag's FRONT part)."""

    def __init__(self, blocks, kernel, how: tuple[bool, bool, bool], shape, dtype, device):
        from tokenring_xdit.ring.kernels import row_delta
        from tokenring_xdit.ring.tensor_layout import BSHD

        batch, t, heads, kv_heads, d = shape
        self.train, self.inference, self.single = how
        gen = torch.Generator(device=device).manual_seed(t)

        def rand(seq: int, h: int) -> torch.Tensor:
            return torch.randn(batch, seq, h, d, generator=gen, device=device).to(dtype)

        k, v = rand(t, kv_heads), rand(t, kv_heads)
        self.layout, self.scale, self.kernel = BSHD, d**-0.5, kernel
        self.calls = [
            (b, rand(b.q_len, heads), k[:, : b.kv_len], v[:, : b.kv_len],
             rand(b.q_len, heads) if self.train else None)
            for b in blocks
        ]  # fmt: skip
        self.saved = []
        if self.train:  # what the backward reads (values do not change the kernels' time)
            for b, q, kb, vb, do in self.calls:
                out, lse = kernel.run_forward(q, kb, vb, self.scale, BSHD, b.mask)
                self.saved.append((out, lse.float().contiguous(), row_delta(do, out, BSHD)))

    def run(self) -> None:
        lay, scale = self.layout, self.scale
        for b, q, k, v, _ in self.calls:
            if self.inference:
                self.kernel(q, k, v, scale, lay)
            else:
                self.kernel.run_forward(q, k, v, scale, lay, b.mask)
        for (b, q, k, v, do), (out, lse, delta) in zip(self.calls, self.saved, strict=False):
            if self.single:  # ring degree 1: the kernel reads O itself, as SDPA does
                self.kernel.run_backward(do, q, k, v, out, lse, None, scale, lay, b.mask)
            else:
                own = out if b.own else None
                self.kernel.run_backward(do, q, k, v, own, lse, delta, scale, lay, b.mask)


def _kernel_for(
    shape, dtype, device, kernel: str, train: bool, inference: bool, packed: bool,
    windowed: bool = False,
):  # fmt: skip
    from tokenring_xdit.ring.seam.kernel_choice import resolve_kernel
    from tokenring_xdit.ring.tensor_layout import BSHD

    batch, t, heads, kv_heads, d = shape
    q = torch.empty(batch, t, heads, d, dtype=dtype, device=device)
    k = torch.empty(batch, t, kv_heads, d, dtype=dtype, device=device)
    choice = resolve_kernel(
        kernel, None, q, k, k, BSHD, train=not inference, deterministic=False, packed=packed,
        windowed=windowed,
    )  # fmt: skip
    if choice.fn is None:
        raise RuntimeError(f"no kernel for this call: {choice.problem_text}")
    return choice.fn


def ceiling(
    tokens: int, heads: int, head_dim: int, ring: int, *, kv_heads: int | None = None,
    batch: int = 1, causal: bool = False, docs=None, train: bool = False,
    dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cuda",
    kernel: str = "auto", warmup: int = 1, iters: int = 3, budget_ms: float = 2000.0,
    whole_ms: float | None = None, defer_own: float | None = None, final_chunks: int = 1,
    window_size: tuple[int, int] | None = None, split: str = "zigzag",
) -> dict:  # fmt: skip
    """The kernel ceiling of one (shape, ring degree, mask, pass); see the module docstring.

    docs: `documents.Documents` of the whole sequence (packed documents; `causal` says whether
    they are causal inside). whole_ms: the one-GPU time when already known (it does not depend
    on `ring`; for a window, its default is the ring's own N = 1 call, one band kernel call).
    window_size: flash-attn's (left, right), the blocks the window plan's (split: "zigzag" or
    "contiguous" shards of a causal call). Returns a dict (the JSON row): whole_ms, per-rank
    kernels-only ms (ranks with the same calls are timed once), the busiest rank and the
    ceiling; with a window also the busiest rank's calls and ms per kernel (`kernels`)."""
    device = torch.device(device)
    kv_heads = kv_heads or heads
    packed, windowed = docs is not None, window_size is not None
    zigzag = causal and ring > 1 and split == "zigzag"
    if tokens % (2 * ring if zigzag else ring):
        raise ValueError(f"{tokens} tokens do not split into {split} shards of {ring}")
    inference = not uses_block_steps(causal, train, packed, windowed)
    args = dict(causal=causal, train=train, docs=docs, defer_own=defer_own,
                final_chunks=final_chunks, window=window_size, split=split)  # fmt: skip
    t = tokens // ring
    shape = (batch, t, heads, kv_heads, head_dim)
    fn = _kernel_for(shape, dtype, device, kernel, train, inference, packed, windowed)
    times = {}
    per_rank = []
    for rank in range(ring if ring > 1 else 0):  # ring 1: the whole sequence, timed below
        blocks = rank_blocks(ring, rank, t, **args)
        key = tuple(blocks)
        if key not in times:
            work = _Rank(blocks, fn, (train, inference, ring == 1), shape, dtype, device)
            times[key] = _timed(work.run, device, warmup, iters, budget_ms) if blocks else 0.0
            del work
        per_rank.append(times[key])
    if whole_ms is None:
        whole = _Rank(
            rank_blocks(1, 0, tokens, **args), fn, (train, inference, True),
            (batch, tokens, heads, kv_heads, head_dim), dtype, device,
        )  # fmt: skip
        whole_ms = _timed(whole.run, device, warmup, iters, budget_ms)
        del whole
    if ring == 1:
        per_rank = [whole_ms]
    busiest = max(range(ring), key=per_rank.__getitem__)
    name = getattr(fn, "name", None) or getattr(fn, "__name__", type(fn).__name__)
    row = dict(
        tokens=tokens, tokens_per_rank=t, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
        batch=batch, ring=ring, mask=mask_name(causal, packed),
        **{"pass": "fwd+bwd" if train else "fwd"},
        kernel=name, dtype=str(dtype).removeprefix("torch."),
        documents=docs.count if packed else None,
        blocks=len(rank_blocks(ring, busiest, t, **args)),
        whole_ms=whole_ms, rank_ms=per_rank, busiest_rank=busiest, busiest_ms=per_rank[busiest],
        ceiling=(whole_ms / ring) / per_rank[busiest] if per_rank[busiest] else None,
    )  # fmt: skip
    if windowed:
        row.update(
            split=split,
            window_size=list(window_size),
            window=window_size[0] + 1 if causal and window_size[0] >= 0 else None,
        )
        # the record as many K/V heads resolve: no GQA wrapper to see its routing through
        record = _kernel_for((batch, t, heads, heads, head_dim), dtype, device, kernel, train,
                             False, packed, True)  # fmt: skip
        local = t if ring > 1 else tokens
        run = functools.partial(
            _Rank,
            kernel=fn,
            how=(train, False, ring == 1),
            dtype=dtype,
            shape=(batch, local, heads, kv_heads, head_dim),
            device=device,
        )
        times = functools.partial(_timed, device=device, warmup=warmup, iters=iters,
                                  budget_ms=budget_ms)  # fmt: skip
        blocks = rank_blocks(max(ring, 1), busiest, local, **args)
        row["kernels"] = _per_kernel(blocks, record, run, times, row["busiest_ms"])
    return row


def _per_kernel(blocks, record, run, times, busiest_ms: float) -> dict:
    """{kernel name: {"calls", "segments", "banded" (segments with a band), "ms"}} of one rank's
    blocks, each kernel's calls timed back to back (the only kernel: the rank's time)."""
    from tokenring_xdit.ring.kernels.window import runs_block

    groups: dict[str, list] = {}
    for b in blocks:
        groups.setdefault(runs_block(record, b.mask).name, []).append(b)
    out = {}
    for name, group in groups.items():
        segs = [s for b in group if not isinstance(b.mask, bool) for s in b.mask]
        ms = busiest_ms if len(groups) == 1 else times(run(group).run)
        out[name] = dict(
            calls=len(group),
            segments=len(segs),
            banded=sum(s.band is not None for s in segs),
            ms=ms,
        )
    return out


def mask_name(causal: bool, packed: bool) -> str:
    return ("packed" if causal else "packed-full") if packed else ("causal" if causal else "full")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default="16384,32768,65536,131072", help="global sequence lengths")
    p.add_argument("--rings", default="2,4,8")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", default="8,32", help="K/V head counts (GQA and MHA)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--masks", default="full,causal,packed", help=",".join(MASKS))
    p.add_argument("--passes", default="fwd,fwd+bwd", help=",".join(PASSES))
    p.add_argument("--docs", default="exp:4096", help="packed lengths: exp:MEAN, fixed:LEN, cu:..")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--kernel", default="auto")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3, help="most timed runs per measurement")
    p.add_argument("--budget-ms", type=float, default=1500.0, help="timed ms per measurement")
    p.add_argument("--time-limit", type=float, help="seconds; start no new shape after them")
    p.add_argument("--out", default="ceiling.json")
    w = p.add_argument_group("sliding windows (--windows: causal window rows instead of --masks)")
    w.add_argument("--windows", default="", help="causal windows of W tokens, window_size=(W-1, 0)")
    w.add_argument("--splits", default="zigzag,contiguous", help="causal shards: zigzag,contiguous")
    w.add_argument(
        "--whole-kernels",
        default=",".join(KERNELS),
        help="the whole sequence's window kernels; the ceiling takes the fastest",
    )
    w.add_argument(
        "--band-kernels",
        default=",".join(KERNELS),
        help="kernels timed on the busiest rank's banded segments ('': none)",
    )
    w.add_argument(
        "--masked-limit",
        type=float,
        default=2**27,
        help="the exact kernel only where heads x rows x columns stay under this",
    )
    args = p.parse_args(argv)

    masks, passes = args.masks.split(","), args.passes.split(",")
    for m in masks:
        if m not in MASKS:
            p.error(f"--masks: {m!r} is not one of {MASKS}")
    for x in passes:
        if x not in PASSES:
            p.error(f"--passes: {x!r} is not one of {PASSES}")
    dtype = getattr(torch, args.dtype)
    for name in filter(None, f"{args.whole_kernels},{args.band_kernels}".split(",")):
        if name not in KERNELS:
            p.error(f"--whole-kernels / --band-kernels: {name!r} is not one of {KERNELS}")
    for split in args.splits.split(","):
        if split not in SPLITS:
            p.error(f"--splits: {split!r} is not one of {SPLITS}")
    rows, started = [], time.time()
    meta = dict(
        machine=platform.node(), device=_device_name(args.device), torch=torch.__version__,
        cudnn=torch.backends.cudnn.version(),
        command="python -m benchmarks ceiling " + " ".join(sys.argv[1:] if argv is None else argv),
        time=time.strftime("%Y-%m-%d %H:%M"), docs=args.docs,
    )  # fmt: skip
    if args.windows:
        _window_sweep(args, dtype, meta, started)
        return 0
    for tokens, kv, m, pass_ in itertools.product(
        _ints(args.tokens), _ints(args.kv_heads), masks, passes
    ):
        if args.time_limit and time.time() - started > args.time_limit:
            meta["stopped"] = f"--time-limit {args.time_limit} s: later shapes not timed"
            print(meta["stopped"], flush=True)
            break
        causal = m in ("causal", "packed")
        docs = documents_of(args.docs, tokens) if m.startswith("packed") else None
        whole = None
        for n in _ints(args.rings):
            row = ceiling(
                tokens, args.heads, args.head_dim, n, kv_heads=kv, batch=args.batch,
                causal=causal, docs=docs, train=pass_ == "fwd+bwd", dtype=dtype,
                device=args.device, kernel=args.kernel, warmup=args.warmup,
                iters=args.iters, budget_ms=args.budget_ms, whole_ms=whole,
            )  # fmt: skip
            whole = row["whole_ms"]
            rows.append(row)
            print(_line(row, time.time() - started), flush=True)
        _write(args.out, meta, rows)  # after every shape: a killed run keeps what it timed
        if args.device == "cuda":
            torch.cuda.empty_cache()
    _write(args.out, meta, rows)
    print(f"wrote {args.out} ({len(rows)} rows, {time.time() - started:.0f} s)")
    return 0


def _write(path: str, meta: dict, rows: list[dict], bands: list[dict] | None = None) -> None:
    with open(path, "w") as f:
        f.write('{"meta": ' + json.dumps(meta, indent=1) + ',\n "rows": [\n ')
        f.write(",\n ".join(json.dumps(r) for r in rows) + "\n]")
        if bands is not None:
            f.write(',\n "bands": [\n ' + ",\n ".join(json.dumps(b) for b in bands) + "\n]")
        f.write("}\n")


def _window_sweep(args, dtype: torch.dtype, meta: dict, started: float) -> None:
    """The --windows rows: per (tokens, K/V heads, W, pass) the whole sequence on each window
    kernel, then per split and ring degree the ceiling row (whole_ms: the fastest of them) and
    the busiest rank's banded segments on each band kernel (`bands`, each shape timed once)."""
    meta.update(windows=args.windows, splits=args.splits, masked_limit=args.masked_limit)
    bench = _Bench(args, dtype)
    rows, splits = [], args.splits.split(",")
    for tokens, kv, w, pass_ in itertools.product(
        _ints(args.tokens), _ints(args.kv_heads), _ints(args.windows), args.passes.split(",")
    ):
        if args.time_limit and time.time() - started > args.time_limit:
            meta["stopped"] = f"--time-limit {args.time_limit} s: later shapes not timed"
            print(meta["stopped"], flush=True)
            break
        train = pass_ == "fwd+bwd"
        why = bench.too_big(tokens, train)
        if why:
            meta.setdefault("skipped", []).append(f"S={tokens} kv={kv} W={w} {pass_}: {why}")
            print(meta["skipped"][-1], flush=True)
            continue
        whole = bench.rect(tokens, tokens, (0, w - 1), kv, train, args.whole_kernels)
        best = _fastest(whole)
        for split, n in itertools.product(splits, _ints(args.rings)):
            if tokens % (2 * n if split == "zigzag" and n > 1 else n):
                continue
            row = bench.row(tokens, kv, w, train, split, n, best)
            row.update(whole_kernels_ms=whole, whole_kernel=best[0] if best else row["kernel"])
            rows.append(row)
            print(_line(row, time.time() - started), flush=True)
        _write(args.out, meta, rows, bench.bands)  # after every shape: a killed run keeps them
        if args.device == "cuda":
            torch.cuda.empty_cache()
    _write(args.out, meta, rows, bench.bands)
    print(f"wrote {args.out} ({len(rows)} rows, {len(bench.bands)} band shapes, "
          f"{time.time() - started:.0f} s)")  # fmt: skip


class _Bench:
    """The window sweep's shared state: its timer, the band shapes timed so far (`bands`)."""

    def __init__(self, args, dtype: torch.dtype) -> None:
        self.args, self.dtype, self.bands, self._done = args, dtype, [], {}
        self.timed = functools.partial(_timed, device=torch.device(args.device),
                                       warmup=args.warmup, iters=args.iters,
                                       budget_ms=args.budget_ms)  # fmt: skip

    def too_big(self, tokens: int, train: bool) -> str | None:
        """Why the whole sequence would not fit this GPU's free memory (None: it would)."""
        if self.args.device != "cuda":
            return None
        a = self.args
        need = _wk().bytes_needed(tokens, tokens, a.heads, a.head_dim, train, self.dtype)
        free = torch.cuda.mem_get_info()[0]
        return f"needs ~{need / 2**30:.0f} GiB, {free / 2**30:.0f} free" if need > free else None

    def rect(self, n_q: int, n_k: int, band, kv: int, train: bool, kernels: str) -> dict:
        """{kernel: ms or why not} of one banded rectangle, timed once per sweep."""
        key = (n_q, n_k, tuple(band), kv, train, kernels)
        if key not in self._done:
            a = self.args
            self._done[key] = _wk().rect_ms(
                n_q, n_k, tuple(band), a.heads, kv, a.head_dim, train=train, dtype=self.dtype,
                device=a.device, kernels=tuple(filter(None, kernels.split(","))),
                timed=self.timed, masked_limit=a.masked_limit,
            )  # fmt: skip
        return self._done[key]

    def row(self, tokens: int, kv: int, w: int, train: bool, split: str, n: int, best) -> dict:
        a = self.args
        try:
            row = ceiling(
                tokens, a.heads, a.head_dim, n, kv_heads=kv, batch=a.batch, causal=True,
                train=train, dtype=self.dtype, device=a.device, kernel=a.kernel,
                warmup=a.warmup, iters=a.iters, budget_ms=a.budget_ms,
                whole_ms=best[1] if best else None, window_size=(w - 1, 0), split=split,
            )  # fmt: skip
        except torch.OutOfMemoryError as exc:
            if a.device == "cuda":
                torch.cuda.empty_cache()
            return dict(tokens=tokens, kv_heads=kv, window=w, split=split, ring=n,
                        error=str(exc).splitlines()[0][:200],
                        **{"pass": "fwd+bwd" if train else "fwd"})  # fmt: skip
        if a.band_kernels:
            row.update(self._band_fields(row, tokens, kv, w, train, split, n))
        return row

    def _band_fields(self, row, tokens, kv, w, train, split, n) -> dict:
        """The busiest rank's banded segments and each band kernel's ms over all of them."""
        blocks = rank_blocks(n, row["busiest_rank"], tokens // n, causal=True, train=train,
                             window=(w - 1, 0), split=split)  # fmt: skip
        counts: dict = {}
        for b in blocks:
            for s in () if isinstance(b.mask, bool) else b.mask:
                if s.band is not None:
                    shape = (s.q1 - s.q0, s.k1 - s.k0, s.band)
                    counts[shape] = counts.get(shape, 0) + 1
        times = {}
        for n_q, n_k, band in counts:
            done = len(self._done)
            times[n_q, n_k, band] = self.rect(n_q, n_k, band, kv, train, self.args.band_kernels)
            if len(self._done) > done:  # a shape not timed before: one `bands` entry
                self.bands.append(dict(n_q=n_q, n_k=n_k, band=list(band), heads=self.args.heads,
                                       kv_heads=kv, **{"pass": row["pass"]},
                                       ms=times[n_q, n_k, band]))  # fmt: skip
        total = {}
        for name in filter(None, self.args.band_kernels.split(",")):
            each = [(c, times[shape][name]) for shape, c in counts.items()]
            why = next((ms for _, ms in each if not isinstance(ms, float)), None)
            total[name] = why if why is not None else sum(c * ms for c, ms in each)
        segments = [[q, k, *band, c] for (q, k, band), c in counts.items()]
        return dict(band_segments=segments, band_kernels_ms=total)


def _fastest(times: dict):
    return _wk().fastest(times)


def _wk():
    """benchmarks/_window_kernels.py (this folder on sys.path: the script also runs by path)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import _window_kernels

    return _window_kernels


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"


def _line(row: dict, elapsed: float) -> str:
    c = row.get("ceiling")
    mask = row.get("mask", "")
    if row.get("split"):
        mask += f" W={row['window']} {row['split']}"
    return (
        f"[{elapsed:5.0f} s] S={row['tokens']:>6} h={row['heads']}/{row['kv_heads']} "
        f"ring {row['ring']:>2} {mask:<11} {row['pass']:<7} {row['kernel']:<14} "
        f"whole {row['whole_ms']:9.3f} ms  busiest rank {row['busiest_ms']:9.3f} ms "
        f"({row['blocks']} calls)  ceiling {c:.3f}"
        if c is not None
        else f"[{elapsed:5.0f} s] {row}"
    )


if __name__ == "__main__":
    sys.exit(main())
