"""docs/benchmarks holds evidence, not logs: every file there is cited by a doc page, packaged data,
a benchmark script or a test, and has its command in docs/benchmarks/README.md; every
docs/benchmarks path the tree cites exists; the folder stays small."""

from __future__ import annotations

import fnmatch
import itertools
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "docs" / "benchmarks"
INDEX = BENCH / "README.md"
TEXT = (".md", ".py", ".json", ".toml", ".sh", ".txt", ".cfg")
MAX_BYTES, MAX_FILES = 3_000_000, 155
# a path written in the tree: docs/benchmarks/..., or a markdown link from docs/ or the root
CITED_PATH = re.compile(r"docs/benchmarks/[\w.*{},/-]*[\w*}/]")
DOC_LINK = re.compile(r"\]\((benchmarks/[^)\s#]*)(#[\w-]+)?\)")
ROOT_LINK = re.compile(r"\]\((docs/benchmarks/[^)\s#]*)(#[\w-]+)?\)")
GLOB_TOKEN = re.compile(r"[\w.{},/-]*\*[\w.{},*/-]*")
FOLDER_NAME = re.compile(r"[\"'/`(]([a-z0-9]+(?:-[a-z0-9]+)*-20\d\d-\d\d(?:-\d\d)?)\b")


def _tracked() -> list[Path]:
    done = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"the evidence checks read the checkout's files: {done.stderr}"
    return [ROOT / name for name in done.stdout.splitlines() if (ROOT / name).is_file()]


def _braces(pattern: str) -> list[str]:
    """Expand {a,b} groups (README rows name several files in one)."""
    parts = re.split(r"\{([^{}]*)\}", pattern)
    options = [p.split(",") if i % 2 else [p] for i, p in enumerate(parts)]
    return ["".join(choice) for choice in itertools.product(*options)]


EVIDENCE = sorted(p.relative_to(BENCH).as_posix() for p in BENCH.rglob("*") if p.is_file())
FILES = [p for p in _tracked() if p.suffix in TEXT]
CITERS = {p: p.read_text(errors="replace") for p in FILES if BENCH not in p.parents}


def _cites(text: str, rel: str) -> bool:
    folder, _, rest = rel.partition("/")
    if rel in text:
        return True
    # name patterns (sweep_*.json): a leading * would cite everything, so it does not count
    globs = [g for token in GLOB_TOKEN.findall(text) for g in _braces(token)
             if re.match(r"[\w/.-]+\*", g.split("docs/benchmarks/")[-1])]  # fmt: skip
    if any(fnmatch.fnmatch(rel, g.split("docs/benchmarks/")[-1]) for g in globs):
        return True
    # code that joins the folder and the name, or a page that names the folder then its files
    if folder not in text:
        return False
    name = rest.rpartition("/")[2]
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) is not None or any(
        fnmatch.fnmatch(rest, g) or fnmatch.fnmatch(name, g) for g in globs
    )


def test_every_evidence_file_is_cited_outside_the_folder():
    uncited = [rel for rel in EVIDENCE if rel != "README.md"
               and not any(_cites(text, rel) for text in CITERS.values())]  # fmt: skip
    assert EVIDENCE and not uncited, f"cited by no doc, data, script or test: {uncited}"


def _index_sections() -> dict[str, str]:
    sections = re.split(r"^## ", INDEX.read_text(), flags=re.M)[1:]
    return {s.split("\n", 1)[0].strip(): s for s in sections}


def test_every_evidence_file_has_its_command_in_the_index():
    sections = _index_sections()
    folders = sorted({rel.split("/")[0] for rel in EVIDENCE if "/" in rel})
    assert folders and sorted(sections) == folders, (sorted(sections), folders)
    missing = []
    for rel in EVIDENCE:
        if rel == "README.md":
            continue
        folder, _, rest = rel.partition("/")
        names = [n for token in re.findall(r"`([^`]+)`", sections[folder]) for n in _braces(token)]
        if not any(fnmatch.fnmatch(rest, n) or n == rest for n in names):
            missing.append(rel)
    assert not missing, f"no row of docs/benchmarks/README.md names: {missing}"
    for folder, text in sections.items():  # machine, date and commit in every section
        assert re.search(r"\b(H100|H200)\b", text) or "no GPU" in text, folder
        assert re.search(r"20\d\d-\d\d-\d\d", text), folder
        assert re.search(r"\b[0-9a-f]{7}\b", text), folder


def _cited_paths() -> list[tuple[Path, str, str]]:
    """(citing file, the path as written, the path it means under the root)."""
    found = []
    for path, text in {**CITERS, INDEX: INDEX.read_text()}.items():
        for written in CITED_PATH.findall(text):
            if not re.search(r"\{[^,{}]*\}", written):  # an f-string's {name} is no path yet
                found.append((path, written, written.rstrip(".,;:")))
        links = DOC_LINK if path.parent == ROOT / "docs" else ROOT_LINK
        if path.suffix == ".md" and path.parent in (ROOT, ROOT / "docs"):
            for target, anchor in links.findall(text):
                base = "docs/" if links is DOC_LINK else ""
                found.append((path, target + anchor, base + target + anchor))
        for name in FOLDER_NAME.findall(text):  # a folder named on its own (code joins paths)
            found.append((path, name, f"docs/benchmarks/{name}/"))
    return found


def test_every_cited_evidence_path_exists():
    anchors = set(_index_sections())
    broken = []
    for path, written, meant in _cited_paths():
        target, _, anchor = meant.partition("#")
        if anchor and (target.rstrip("/") != "docs/benchmarks/README.md" or anchor not in anchors):
            broken.append((path.relative_to(ROOT).as_posix(), written))
            continue
        patterns = _braces(target)
        if not all(any(True for _ in ROOT.glob(p.rstrip("/"))) for p in patterns):
            broken.append((path.relative_to(ROOT).as_posix(), written))
    assert not broken, f"cited docs/benchmarks paths that do not exist: {broken}"


def test_the_evidence_folder_stays_small():
    size = sum((BENCH / rel).stat().st_size for rel in EVIDENCE)
    assert len(EVIDENCE) <= MAX_FILES and size <= MAX_BYTES, (len(EVIDENCE), size)
