"""The numbers the docs quote from a runnable command are checked against that command, and
every `tokenring_xdit/...py` path the docs name exists, so neither drifts silently again."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from tests.harness import torchrun_script

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_training_losses_quoted_are_those_of_the_command():
    """docs/training.md: `torchrun --nproc-per-node 2 examples/llm_train_tokenring.py --compare
    --steps 3`, its output block and the tolerances stated under it."""
    text = (ROOT / "docs" / "training.md").read_text()
    shown = [float(x) for x in re.findall(r"^step \d+: loss ([\d.]+) \(token_ring\)", text, re.M)]
    assert len(shown) == 3, shown
    near = float(re.search(r"each step's loss within\s+([\d.]+) of the one shown", text)[1])
    loss_tol = float(re.search(r"`max_loss_err` <= (\d[\d.e-]*\d)", text)[1])
    grad_tol = float(re.search(r"`max_grad_err` <= (\d[\d.e-]*\d)", text)[1])
    done = torchrun_script("examples/llm_train_tokenring.py", "--compare", "--steps", "3")
    assert done.returncode == 0, done.stderr[-3000:]
    got = [float(x) for x in re.findall(r"^step \d+: loss ([\d.]+)", done.stdout, re.M)]
    assert len(got) == 3, done.stdout
    assert all(abs(a - b) <= near for a, b in zip(got, shown, strict=True)), (got, shown)
    errs = ast.literal_eval(re.search(r"^\{'max_loss_err'.*\}$", done.stdout, re.M)[0])
    assert errs["max_loss_err"] <= loss_tol and errs["max_grad_err"] <= grad_tol, errs


def test_hf_llama_differences_quoted_are_those_of_the_command():
    """docs/training.md: `torchrun --nproc-per-node 2 examples/hf_llama_tokenring.py` (GQA) and
    the same on 3 ranks with one K/V head (MQA): the largest |loss difference| from one process
    each prints, as quoted (two significant digits; they are a float32 rounding step or two of a
    loss near 5.6, so a change shows)."""
    text = " ".join((ROOT / "docs" / "training.md").read_text().split())
    found = re.search(r"5 steps: max difference ([\d.e-]+); 3 ranks, MQA: ([\d.e-]+)\)", text)
    assert found, "the sentence quoting examples/hf_llama_tokenring.py's differences moved"
    for nproc, extra, quoted in ((2, [], found[1]), (3, ["--kv-heads", "1"], found[2])):
        done = torchrun_script("examples/hf_llama_tokenring.py", *extra, nproc=nproc)
        assert done.returncode == 0, done.stderr[-3000:]
        printed = re.search(r"^max \|diff\| ([\d.e+-]+)$", done.stdout, re.M)
        assert printed, done.stdout
        assert float(f"{float(printed[1]):.1e}") == float(quoted), (nproc, printed[1], quoted)


def test_every_package_path_in_the_docs_exists():
    named = {
        (doc.name, path)
        for doc in DOCS
        for path in re.findall(r"\btokenring_xdit/[\w/]+\.py\b", doc.read_text())
    }
    missing = sorted((doc, path) for doc, path in named if not (ROOT / path).is_file())
    assert named and not missing, missing


def test_compare_times_quoted_are_those_of_the_committed_runs():
    """docs/compare.md: the committed run's time and load (its report), and the range of the
    timed runs with their loads (docs/compare/pixart-tiny-timings.json), as quoted."""
    text = " ".join((ROOT / "docs" / "compare.md").read_text().split())
    committed = json.loads((ROOT / "docs" / "compare" / "pixart-tiny-compare.json").read_text())
    found = re.search(r"otherwise idle \(load ([\d.]+)\), ([\d.]+) s in all", text)
    assert found, "the sentence quoting the committed run's time moved"
    load = committed["load_average_1min"]["before"]
    assert (float(found[1]), float(found[2])) == (round(load, 1), round(committed["wall_s"], 1))
    timed = json.loads((ROOT / "docs" / "compare" / "pixart-tiny-timings.json").read_text())
    runs = timed["runs"]
    seconds = [r["process_s"] for r in runs]
    loads = [x for r in runs for x in (r["load_1min_before"], r["load_1min_after"])]
    quoted = re.search(r"took ([\d.]+)-([\d.]+) s there, start to exit, .*?\(load ([\d.]+)-"
                       r"([\d.]+); docs/compare/pixart-tiny-timings\.json", text)  # fmt: skip
    assert quoted, "the sentence quoting the timed runs moved"
    assert [float(x) for x in quoted.groups()] == [
        round(min(seconds)),
        round(max(seconds)),
        min(loads),
        max(loads),
    ], (quoted.groups(), seconds, loads)
    assert timed["cpus"] == 2 and timed["command"] == "tokenring-xdit compare"
