"""compare's results: runs merged from ranks, metrics, the JSON report, figures, summary."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
from dataclasses import asdict

from .config import (
    CHECKED,
    HOST_LABELS,
    MODEL_NAMES,
    OWN_RING,
    RING_IMPL,
    RUNS,
    SHORT,
    SHOWN,
    Thresholds,
    command_line,
)
from .workers import host_versions


def merge_ranks(name: str, values: list[dict], host: str = "xdit") -> dict:
    """One run's summary from its ranks: the slowest rank per step, the image of the rank
    that has it, every rank's ring-call counts."""
    with_image = [v for v in values if v["image"] is not None]
    if len(with_image) != 1:
        raise RuntimeError(f"{name}: {len(with_image)} ranks returned an image, expected 1")
    steps = [max(col) for col in zip(*(v["step_s"] for v in values), strict=True)]
    first = values[0]
    summary = dict(
        label=HOST_LABELS[host][name],
        ranks=first["ranks"],
        s_per_step=statistics.median(steps),
        mean_s_per_step=statistics.fmean(steps),
        step_s=steps,
        total_s=max(v["total_s"] for v in values),
        threads_per_rank=first["threads_per_rank"],
        image=with_image[0]["image"],
        latents=_gather_latents([v["latents"] for v in values]),
    )
    if "gpu" in first:
        summary["gpu"] = first["gpu"]
    if name != "single":
        summary["ring_impl_type"] = RING_IMPL[name]
        summary["selected"] = first["ring_impl"]
        summary["attention_backend"] = first["attention_backend"]
        summary["ring_calls_per_rank"] = [v["ring_calls"] for v in values]
    return summary


def _gather_latents(parts: list):
    """The whole final latents from the ranks' parts: xDiT's sequence parallelism splits them
    along dim -2 (PixArt: latent rows; Flux: packed tokens) in rank order. diffusers' context
    parallelism gathers them on every rank: one rank returns them whole, the others None."""
    import numpy as np

    parts = [p for p in parts if p is not None]
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-2)


def path_checks(runs: dict, host: str = "xdit") -> list[str]:
    """A run that did not take the ring path it claims (a silent fall-back would compare a
    ring with itself): every rank of the ring run called only the host's own ring, every rank
    of the TokenRing run only TokenRing."""
    own = OWN_RING[host]
    bad = []
    for name, expect, other in (("ring", own, "token_ring"), ("token_ring", "token_ring", own)):
        for rank, calls in enumerate(runs[name]["ring_calls_per_rank"]):
            if calls[expect] == 0 or calls[other] != 0:
                bad.append(f"{HOST_LABELS[host][name]} rank {rank}: ring calls {calls}")
    return bad


def latent_rel_diff(test, reference) -> float:
    import numpy as np

    scale = float(np.abs(reference).max())
    return float(np.abs(np.asarray(test) - reference).max()) / (scale or 1.0)


def compare_runs(runs: dict, thresholds: Thresholds) -> list[dict]:
    from ..images import image_metrics

    out = []
    for test, ref in SHOWN:
        m = image_metrics(runs[test]["image"], runs[ref]["image"])
        m["latent_rel_diff"] = latent_rel_diff(runs[test]["latents"], runs[ref]["latents"])
        checked = (test, ref) in CHECKED
        failures = thresholds.failures(m) if checked else []
        out.append(dict(test=test, reference=ref, checked=checked, failures=failures, **m))
    return out


def _image_stats(image) -> dict:

    return dict(
        mean=float(image.mean()),
        std=float(image.std()),
        saturated_fraction=float(((image <= 0.0) | (image >= 1.0)).mean()),
    )


def _finite(x):
    """JSON has no infinity: identical images have PSNR "inf" (a string)."""
    if isinstance(x, float) and not math.isfinite(x):
        return "inf" if x > 0 else "-inf"
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def build_report(cfg, thresholds, runs, comparisons, problems, passed, out_dir, wall) -> dict:
    prefix = cfg.name
    files = {name: f"{prefix}-{name}.png" for name in RUNS}
    files.update(figure=f"{prefix}-compare.png", report=f"{prefix}-compare.json")
    run_info = {}
    for name, r in runs.items():
        run_info[name] = {k: v for k, v in r.items() if k not in ("image", "latents")}
        run_info[name]["image_stats"] = _image_stats(r["image"])
        run_info[name]["file"] = files[name]
    return dict(
        tool="tokenring-xdit compare",
        passed=passed,
        command=command_line(cfg, out_dir),
        config=asdict(cfg),
        model=dict(
            name=MODEL_NAMES[cfg.model],
            size=cfg.size,
            weights="seeded random (no checkpoint), text encoders replaced by seeded prompt "
            "embeddings",
            qk_gain=cfg.qk_gain,
        ),
        thresholds=asdict(thresholds),
        runs=run_info,
        comparisons=comparisons,
        path_problems=problems,
        versions=host_versions(),
        platform=platform.platform(),
        wall_s=wall,
        files=files,
    )


def write_outputs(cfg, runs, comparisons, report, out_dir, gain) -> None:
    from ..images import Panel, auto_gain, diff_map, save_png, side_by_side

    os.makedirs(out_dir, exist_ok=True)
    files = report["files"]
    for name in RUNS:
        save_png(runs[name]["image"], os.path.join(out_dir, files[name]))
    diffs = [c for c in comparisons if c["checked"]]
    if gain is None:
        gain = auto_gain(max(c["max_abs_diff"] for c in diffs))
    report["difference_gain"] = gain
    panels = []
    for name in RUNS:
        r = runs[name]
        ranks = f"{r['ranks']} rank" + ("s" if r["ranks"] > 1 else "")
        lines = [f"{r['s_per_step'] * 1e3:.1f} ms/step, {ranks}"]
        if name != "single":
            lines.append(_selection_text(cfg, name))
        panels.append(Panel(r["image"], cfg.labels[name], lines))
    for c in diffs:
        test, ref = runs[c["test"]]["image"], runs[c["reference"]]["image"]
        title = f"|{SHORT[c['test']]} - {SHORT[c['reference']]}| x {_gain_text(gain)}"
        lines = [
            f"PSNR {_psnr_text(c['psnr_db'])} dB, SSIM {c['ssim']:.6f}",
            f"max |diff| {c['max_abs_diff']:.2e} ({c['max_abs_diff'] * 255:.2g}/255)",
            f"final latents: rel. diff {c['latent_rel_diff']:.2e}",
        ]
        lines += ["ok"] if not c["failures"] else ["FAILED:", *c["failures"]]
        panels.append(Panel(diff_map(test, ref, gain), title, lines))
    dev = "CPU" if cfg.device == "cpu" else runs["ring"].get("gpu", "GPU")
    heading = (
        f"{MODEL_NAMES[cfg.model]} ({cfg.size}, random weights), {cfg.width}x{cfg.height}, "
        f"{cfg.steps} steps, {dev} {cfg.dtype}, {_host_text(cfg)}ulysses {cfg.ulysses} x ring "
        f"{cfg.ring}: " + ("PASSED" if report["passed"] else "FAILED")
    )
    t = report["thresholds"]
    v = report["versions"]
    footer = [
        f"thresholds: PSNR >= {t['psnr_min']:g} dB, max |diff| <= {t['max_diff']:.3g}, "
        f"latent rel. diff <= {t['latent_rtol']:.3g}; difference maps: channel max of "
        f"|a - b| x {_gain_text(gain)}, black 0 -> white >= {1 / gain:.0e}; ms/step: median",
        f"tokenring-xdit {v['tokenring-xdit']}, torch {v['torch']}, xfuser {v['xfuser']}, "
        f"yunchang {v['yunchang']}, diffusers {v['diffusers']}",
    ]
    figure = side_by_side(panels, heading=heading, footer=footer)
    figure.save(os.path.join(out_dir, files["figure"]))
    with open(os.path.join(out_dir, files["report"]), "w") as fh:
        json.dump(_finite(report), fh, indent=2)
        fh.write("\n")


# ------------------------------------------------------------------------------------------
# CLI


# The console's runs table shows ms/step; on CPU they say nothing about speed (docs/compare.md).
CPU_TIMING_NOTE = (
    "[yellow]note:[/] CPU timings (gloo between processes on shared cores, a 2-layer random "
    "model) are no performance claim: the runs are timed only to show they ran. GPU "
    "measurements: docs/performance.md"
)


def print_summary(console, report: dict) -> None:
    from rich import box
    from rich.table import Table

    def table(title: str) -> Table:
        return Table(
            title=title,
            box=box.SIMPLE_HEAD,
            show_edge=False,
            title_justify="left",
            padding=(0, 1),
        )

    runs = table("runs (ms/step: median over the steps, slowest rank)")
    for col in ("run", "ranks", "ms/step", "total s", "ring calls per rank"):
        runs.add_column(col, justify="right" if col in ("ranks", "ms/step", "total s") else "left")
    for name, r in report["runs"].items():
        calls = r.get("ring_calls_per_rank", [{}])[0]
        calls_text = ", ".join(f"{k} {v}" for k, v in calls.items()) or "-"
        runs.add_row(
            SHORT[name],
            str(r["ranks"]),
            f"{r['s_per_step'] * 1e3:.1f}",
            f"{r['total_s']:.2f}",
            calls_text,
        )
    console.print(runs)
    if report["config"]["device"] == "cpu":
        console.print(CPU_TIMING_NOTE)
    images = table("images and final latents")
    for col in ("test vs reference", "PSNR dB", "SSIM", "max |diff|", "latent rel.", "ok"):
        images.add_column(col, justify="left" if col == "test vs reference" else "right")
    for c in report["comparisons"]:
        ok = "[green]yes[/]" if not c["failures"] else "[bold red]NO[/]"
        images.add_row(
            f"{SHORT[c['test']]} vs {SHORT[c['reference']]}",
            _psnr_text(c["psnr_db"]),
            f"{c['ssim']:.6f}",
            f"{c['max_abs_diff']:.2e}",
            f"{c['latent_rel_diff']:.2e}",
            ok if c["checked"] else "[dim]info[/]",
        )
    console.print(images)


def _host_text(cfg) -> str:
    """The heading names the host when it is not xDiT (the xDiT figure stays as it was)."""
    return "" if cfg.host == "xdit" else "diffusers CP, "


def _selection_text(cfg, name: str) -> str:
    """How the run chose its ring, as the user would write it."""
    if cfg.host == "xdit":
        return f"--ring_impl_type {RING_IMPL[name]}"
    return f"ring_degree={cfg.ring}, ring impl {RING_IMPL[name]}"


def _psnr_text(psnr: float) -> str:
    return "inf" if math.isinf(psnr) else f"{psnr:.1f}"


def _gain_text(gain: float) -> str:
    exponent = math.log10(gain)
    return f"1e{exponent:.0f}" if exponent == round(exponent) else f"{gain:g}"
