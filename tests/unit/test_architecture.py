"""The package's shape: one config object reads the environment, the ring is host-agnostic, no
import circles, README's environment table is the config's."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tokenring_xdit import config

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "tokenring_xdit"
# Modules that may touch os.environ: the config (reads ours), the bootstrap (must not import
# the config at interpreter start-up), the launchers (set the children's environment) and the
# rank exit of the examples (reads torchrun's RANK and xDiT's LOG_LEVEL, none of ours).
ENV_MODULES = {"config", "_bootstrap", "tools.launch", "tools.compare.run", "tools.rank_exit"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(PKG).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path) -> set[str]:
    """tokenring_xdit modules `name` imports anywhere in its body (functions included)."""
    package = name.rsplit(".", 1)[0] if path.name != "__init__.py" else name
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                mod = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module and node.module.startswith("tokenring_xdit"):
                mod = node.module.removeprefix("tokenring_xdit").lstrip(".")
            else:
                continue
            out.add(mod)
            out.update(f"{mod}.{a.name}".strip(".") for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("tokenring_xdit."):
                    out.add(a.name.removeprefix("tokenring_xdit."))
    return out


# A module named in a string: "tokenring_xdit.a.b" or "tokenring_xdit.a.b:attr" (entry points,
# lazy maps), an f-string starting with "tokenring_xdit.a.", or import_module / __import__ of a
# literal name. Loaded later by name, each is an import the plain graph would not see.
_NAMED = re.compile(r"^tokenring_xdit((?:\.[A-Za-z_]\w*)+)\.?(?::[A-Za-z_]\w*)?$")


def _named_module(text: str, package: str = "") -> str | None:
    if text.startswith(".") and package:  # import_module(".x", __package__)
        text = f"tokenring_xdit.{package}{text}".replace("tokenring_xdit..", "tokenring_xdit.")
    found = _NAMED.match(text)
    return found.group(1).lstrip(".") if found else None


def _string_imports(name: str, path: Path) -> set[str]:
    """tokenring_xdit modules `name` names in strings (see _NAMED), wherever they appear."""
    package = name.rsplit(".", 1)[0] if path.name != "__init__.py" else name
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        text = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            text = first.value if isinstance(first, ast.Constant) else None
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                text = node.args[0].value
        if text is not None and (found := _named_module(text, package)) is not None:
            out.add(found)
    return out


def _graph(strings: bool = False) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (and, with strings, names: _string_imports)."""
    mods = _modules()
    graph = {}
    for n, p in mods.items():
        deps = _imports(n, p) | (_string_imports(n, p) if strings and n else set())
        graph[n] = {m for m in deps if m in mods and m != n}
    return graph


def test_only_the_config_reads_our_environment():
    readers = {
        name
        for name, path in _modules().items()
        if "os.environ" in path.read_text() or "getenv" in path.read_text()
    }
    assert readers <= ENV_MODULES, readers - ENV_MODULES
    for name, path in _modules().items():
        if name in ("config", "_bootstrap", "_envflags"):  # _envflags: the bootstrap's two
            continue
        tree = ast.parse(path.read_text())
        names = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)}
        read = [v for v in names if isinstance(v, str) and v.startswith("TOKENRING_XDIT_")]
        assert not read, f"{name} names {read}: read it through tokenring_xdit.config"


def test_the_ring_imports_no_host_patch_or_tool_module():
    graph = _graph(strings=True)
    for name, deps in graph.items():
        if name.startswith("ring"):
            top = ("hosts", "patches", "tools", "planner", "integrations")
            bad = {d for d in deps if d.split(".")[0] in top}
            assert not bad, f"{name} imports {bad}"


def _lower_never_imports(lower: str, upper: str) -> None:
    for name, deps in _graph(strings=True).items():
        if name == lower or name.startswith(lower + "."):
            bad = {d for d in deps if d == upper or d.startswith(upper + ".")}
            assert not bad, f"{name} imports {bad}"


def test_hosts_never_import_patches():
    """patches/ wire hosts/ into the host libraries, never the other way round."""
    _lower_never_imports("hosts", "patches")


def test_planner_never_imports_tools():
    """The planner is a library (the ring's `auto` uses it); its CLI lives in tools/plan_cli.py."""
    _lower_never_imports("planner", "tools")


def _third_party_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
    return found


def test_transformers_is_imported_by_its_integration_only_and_lazily():
    """transformers is an optional dependency: only integrations/ names it, inside functions,
    and importing tokenring_xdit (even the integration module) does not import it."""
    users = {n for n, p in _modules().items() if "transformers" in _third_party_imports(p)}
    assert users <= {"integrations.transformers"}, users
    code = (
        "import sys, tokenring_xdit, tokenring_xdit.ring, tokenring_xdit.integrations.transformers"
        "\nassert 'transformers' not in sys.modules, 'transformers was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_no_import_circles():
    graph = _graph(strings=True)  # the root's lazy public map is left out (_graph)
    # a package imports its own submodules to re-export them: not a circle
    edges = {n: {d for d in deps if not d.startswith(n + ".")} for n, deps in graph.items()}
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep) :] + [dep]
                pytest.fail(f"import circle: {' -> '.join(cycle)}")
            if dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])


def test_no_string_imports_across_layers():
    """A module may name (in a string, or import_module / __import__ of a literal) only modules
    of its own layer (the first part of its name: ring, hosts, patches, ...); the package's
    lazy public map (tokenring_xdit/__init__.py) is the one exception: it is the top."""
    mods = _modules()
    for name, path in mods.items():
        if not name:
            continue
        layer = name.split(".")[0]
        named = {m for m in _string_imports(name, path) if m.split(".")[0] in mods}  # modules
        crossing = {m for m in named if m.split(".")[0] != layer}
        assert not crossing, f"{name} names modules of another layer in strings: {crossing}"


def test_no_module_calls_back_into_its_own_package():
    """`from . import name` / `from .. import name` take submodules only: a package's __init__
    sits above its modules (patches/base.py once called `from . import apply_from_hook`); the
    package root's __version__ is the one exception (the CLI prints it)."""
    mods = _modules()
    for name, path in mods.items():
        parts = path.relative_to(PKG).with_suffix("").parts
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level and node.module is None):
                continue
            base = parts[: len(parts) - node.level]
            taken = {".".join([*base, a.name]) for a in node.names} - {"__version__"}
            upward = {t for t in taken if t not in mods}
            assert not upward, f"{name} takes {upward} from a package above it"


def test_the_string_import_scan_finds_them():
    """The scan sees every form (so the tests above can fail)."""
    code = (
        'import importlib\nX = "tokenring_xdit.patches.torch_dist:ensure_applied"\n'
        'Y = f"tokenring_xdit.hosts.{1}"\nimportlib.import_module(".graphs", __package__)\n'
        '__import__("tokenring_xdit.tools.cli")\n'
    )
    path = PKG.parent / "build" / "scan_probe.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(code)
    try:
        found = _string_imports("ring.comm.groups", path)
    finally:
        path.unlink()
    assert found == {"patches.torch_dist", "hosts", "ring.comm.graphs", "tools.cli"}, found


def test_readme_environment_table_is_the_config():
    assert config.env_table_markdown() in (ROOT / "README.md").read_text(), (
        "README's table of environment variables differs from tokenring_xdit.config.ENV"
    )


def test_config_reads_the_environment_and_rereads_when_it_changes(monkeypatch):
    monkeypatch.setenv("TOKENRING_XDIT_FINAL_CHUNKS", "3")
    monkeypatch.setenv("TOKENRING_XDIT_CUDA_GRAPHS", "off")
    monkeypatch.setenv("TOKENRING_XDIT_VALIDATE", "Always")
    cfg = config.current()
    assert (cfg.final_chunks, cfg.cuda_graphs, cfg.validate) == (3, False, "always")
    assert config.current() is cfg  # unchanged environment: the same object
    monkeypatch.setenv("TOKENRING_XDIT_FINAL_CHUNKS", "zero")
    assert config.current().final_chunks == -1  # rejected on every rank by the input check
    monkeypatch.delenv("TOKENRING_XDIT_FINAL_CHUNKS")
    monkeypatch.delenv("TOKENRING_XDIT_CUDA_GRAPHS")
    monkeypatch.delenv("TOKENRING_XDIT_VALIDATE")
    cfg = config.current()
    assert (cfg.final_chunks, cfg.cuda_graphs, cfg.validate) == (1, True, "auto")
    assert config.RingConfig().replace(validate="signature").validate == "signature"


def test_public_names_are_lazy_and_the_old_paths_still_work():
    """Every name of tokenring_xdit.__all__ resolves, is the object of its home module (old
    import paths keep working), and importing the package loads no torch."""
    code = (
        "import sys, tokenring_xdit\nassert 'torch' not in sys.modules\n"
        "names = [n for n in tokenring_xdit.__all__ if n != '__version__']\n"
        "assert all(callable(getattr(tokenring_xdit, n)) for n in names), names"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    import tokenring_xdit
    from tokenring_xdit.hosts.selection import set_xdit_ring_impl
    from tokenring_xdit.integrations.transformers import register
    from tokenring_xdit.patches import xfuser_cpu
    from tokenring_xdit.ring.split.sharding import shard_positions, zigzag_positions

    assert tokenring_xdit.set_ring_impl is set_xdit_ring_impl
    assert tokenring_xdit.register_transformers is register
    assert tokenring_xdit.zigzag_positions is zigzag_positions
    assert tokenring_xdit.shard_positions is shard_positions
    with pytest.raises(ValueError, match="xfuser, diffusers"):
        tokenring_xdit.enable_cpu_mode("vllm")
    assert callable(xfuser_cpu.enable)
