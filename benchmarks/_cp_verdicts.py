"""What benchmarks/diffusers_cp.py's rows say: per setting the faster backend and why (from the
measured step times, the profiled parts of a step and the bytes sent), the yardstick between two
exact methods, and the printed table. Pure functions of the rows (no process group)."""

from __future__ import annotations

import torch

# profile_ring_call.breakdown's parts of a step (they add up to its window)
PARTS = {
    "attention_ms": "attention kernels",
    "nccl_in_the_open_ms": "NCCL outside attention (transfers and waits nothing hides)",
    "merge_copy_other_in_the_open_ms": "other kernels outside both (GEMMs, norms, merges)",
    "gpu_idle_ms": "GPU idle (launch gaps, host waits)",
}


def errors(got: torch.Tensor, want: torch.Tensor) -> dict:
    diff = got.double() - want.double()
    return dict(max_abs=diff.abs().max().item(), rel_l2=(diff.norm() / want.double().norm()).item())


def _spread(ms: list[float]) -> float:
    return max(ms) - min(ms)


def _total_bytes(row: dict) -> int:
    return row.get("a2a_bytes_per_step", 0) + row.get("ring_bytes_per_step", 0)


def reason(fast: dict, slow: dict) -> str:
    """Why `fast` beats `slow`, from what was measured: step times, the profiled parts of a step
    (the one that grew most), attention's share of the step, bytes sent."""
    f, s = fast["median_step_ms"], slow["median_step_ms"]
    words = [
        f"{fast['backend']} {fast['setting']} {f:.1f} ms/step vs {slow['backend']} "
        f"{slow['setting']} {s:.1f} ({s / f:.3f}x)"
    ]
    spread = max(_spread(r["step_ms"]) for r in (fast, slow))
    if s - f <= spread:  # the steps of one run differ by more than the two runs do
        words.append(f"a tie: the gap is within the step-to-step spread ({spread:.1f} ms)")
    if "profile" in fast and "profile" in slow:
        a, b = fast["profile"]["timeline"], slow["profile"]["timeline"]
        part = max(PARTS, key=lambda k: b.get(k, 0.0) - a.get(k, 0.0))
        words.append(
            f"the profiled step grew most in {PARTS[part]}: {b[part]:.1f} vs {a[part]:.1f} ms"
        )
        share = [t["attention_ms"] / t["window_ms"] for t in (a, b)]
        words.append(f"attention is {share[0]:.0%} vs {share[1]:.0%} of the step")
    else:
        words.append("no profile (CPU or --no-profile): step times only")
    mb = [_total_bytes(r) / 1e6 for r in (fast, slow)]
    words.append(f"each rank sends {mb[0]:.4g} vs {mb[1]:.4g} MB per step")
    return "; ".join(words)


def verdicts(rows: list[dict]) -> list[dict]:
    """Per model and setting, the faster of TokenRing and diffusers' ring; per model, the
    fastest run against the fastest run of the other family (TokenRing or diffusers' own)."""
    out = []
    cp = [r for r in rows if r["setting"] != "one_gpu"]
    pairs = {}
    for r in cp:
        pairs.setdefault((r["model"], r["setting"]), []).append(r)
    for key, group in pairs.items():
        if len(group) < 2:
            continue
        fast, slow = sorted(group, key=lambda r: r["median_step_ms"])[:2]
        out.append(_verdict(key[0], key[1], fast, slow))
    for model in dict.fromkeys(r["model"] for r in cp):
        ranked = sorted((r for r in cp if r["model"] == model), key=lambda r: r["median_step_ms"])
        ours = ranked[0]["backend"] == "token_ring"
        rival = next((r for r in ranked if (r["backend"] == "token_ring") != ours), None)
        if rival is not None:
            out.append(_verdict(model, "fastest", ranked[0], rival))
    return out


def _verdict(model: str, setting: str, fast: dict, slow: dict) -> dict:
    return dict(
        model=model, setting=setting, faster=f"{fast['backend']} {fast['setting']}",
        slower=f"{slow['backend']} {slow['setting']}",
        speedup=slow["median_step_ms"] / fast["median_step_ms"], reason=reason(fast, slow),
    )  # fmt: skip


def yardstick(rows: list[dict], n: int) -> list[dict]:
    """diffusers' ring N against its ulysses N, final latents (both exact methods in bf16)."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        pick = {(r["setting"], r["backend"]): r for r in rows if r["model"] == model}
        ring = pick.get((f"ring{n}", "diffusers_ring"))
        uly = pick.get((f"ulysses{n}", "diffusers_ulysses"))
        if ring and uly:
            got = errors(ring["latents"], uly["latents"])
            out.append(dict(model=model, between=f"diffusers_ring ring{n} vs ulysses{n}", **got))
    return out


def table(rows: list[dict]) -> str:
    head = f"{'model':<12} {'setting':<18} {'backend':<18} {'ms/step':>9} {'eff':>6} "
    head += f"{'max_abs':>9} {'rel_l2':>9} {'attn%':>6} {'nccl_open':>9} {'MB/step':>8}"
    lines = [head]
    for r in rows:
        tl = r.get("profile", {}).get("timeline", {})
        attn = f"{tl['attention_ms'] / tl['window_ms']:.0%}" if tl else "-"
        nccl = f"{tl['nccl_in_the_open_ms']:.1f}" if tl else "-"
        lines.append(
            f"{r['model']:<12} {r['setting']:<18} {r['backend']:<18} "
            f"{r['median_step_ms']:>9.1f} {r.get('efficiency', 1.0):>6.3f} "
            f"{r.get('max_abs', 0.0):>9.2e} {r.get('rel_l2', 0.0):>9.2e} {attn:>6} {nccl:>9} "
            f"{_total_bytes(r) / 1e6:>8.3g}"
        )
    return "\n".join(lines)
