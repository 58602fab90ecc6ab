"""caches.py: Lru and Seen keep their bounds; and the package keeps what a process remembers in
named owners: no module-level dict, list or set that is changed after import, no registration
run at import (beyond the start-up hook)."""

from __future__ import annotations

import ast
from pathlib import Path

from tokenring_xdit.caches import Lru, Seen

PKG = Path(__file__).resolve().parents[2] / "tokenring_xdit"
# where state is kept (tools/ are commands: their tables are read-only lists of subcommands)
SCANNED = ("ring", "hosts", "patches", "planner", "config.py", "caches.py")
CONTAINERS = {"dict", "list", "set", "OrderedDict", "defaultdict", "deque", "Counter",
              "WeakKeyDictionary", "WeakValueDictionary", "WeakSet"}  # fmt: skip
CHANGES = {"append", "add", "update", "pop", "clear", "setdefault", "extend", "insert", "remove",
           "discard", "popitem", "move_to_end", "appendleft", "popleft"}  # fmt: skip
# still bare, each with its module's owner: the split tables (to be replaced by the split as a
# value) and the GPU names of the agreement's header
EXEMPT = {"ring/split/sharding.py": {"_DECLARED", "_NO_GROUP", "_LAYOUTS", "_NO_GROUP_LAYOUTS"},
          "ring/agree/header.py": {"_GPU_DIGESTS"}}  # fmt: skip


def _files() -> list[Path]:
    found = [PKG / part if part.endswith(".py") else (PKG / part).rglob("*.py") for part in SCANNED]
    return sorted(p for f in found for p in ([f] if isinstance(f, Path) else f))


def _is_container(value: ast.expr | None) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        return getattr(func, "id", getattr(func, "attr", None)) in CONTAINERS
    return False


def _module_containers(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and _is_container(node.value):
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names - {"__all__"}


def _changed(tree: ast.Module, names: set[str]) -> set[str]:
    """Which of `names` the module changes: directly, through `global`, or through a local
    name bound to an expression that names them (`table = _A if x else _B; table[k] = v`)."""

    def same(expr: ast.expr) -> set[str]:  # the names whose object `expr` may be
        if isinstance(expr, ast.Name):
            return {expr.id} & names
        if isinstance(expr, ast.IfExp):
            return same(expr.body) | same(expr.orelse)
        if isinstance(expr, ast.BoolOp):
            return set().union(*(same(v) for v in expr.values))
        return set()

    aliases: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, named = node.targets[0], same(node.value)
            if isinstance(target, ast.Name) and named and tree.body.count(node) == 0:
                aliases.setdefault(target.id, set()).update(named)

    def resolve(expr: ast.expr) -> set[str]:
        if isinstance(expr, ast.Name):
            return ({expr.id} & names) | aliases.get(expr.id, set())
        return set()

    changed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            changed |= set(node.names) & names
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in CHANGES:
                changed |= resolve(node.func.value)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = node.targets if not isinstance(node, ast.AugAssign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Subscript) and tree.body.count(node) == 0:
                    changed |= resolve(t.value)
    return changed


def test_module_level_state_has_a_named_owner():
    found = []
    for path in _files():
        tree = ast.parse(path.read_text())
        rel = path.relative_to(PKG).as_posix()
        bare = _changed(tree, _module_containers(tree)) - EXEMPT.get(rel, set())
        found += [f"{rel}: {name}" for name in sorted(bare)]
    assert not found, f"module-level containers changed after import (give them an owner): {found}"


def test_the_scan_finds_them(tmp_path):
    """The scan sees each form (so the test above can fail)."""
    code = (
        "A = {}\nB: list = []\nC = set()\nD = dict()\nT = {'k': 1}\n"
        "def f(x):\n    A[x] = 1\n    B.append(x)\n    t = C if x else D\n    t.add(x)\n"
        "    return T[x]\n"
    )
    tree = ast.parse(code)
    assert _changed(tree, _module_containers(tree)) == {"A", "B", "C", "D"}


def test_nothing_registers_at_import():
    """No module-level call statement: registration (hooks, counters, exit handlers) happens at
    first use. torch's op registrations of the compiled op are the operator's definition."""
    allowed = {"ring/seam/compiled_op.py": {"register_fake", "register_autograd"}}
    calls = []
    for path in _files():
        rel = path.relative_to(PKG).as_posix()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                func = node.value.func
                name = getattr(func, "attr", getattr(func, "id", "?"))
                if name not in allowed.get(rel, set()):
                    calls.append(f"{rel}:{node.lineno} {ast.unparse(node)[:60]}")
    assert not calls, calls


def test_lru_keeps_the_most_recently_used():
    cache = Lru(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" is now the most recent
    cache.put("c", 3)
    assert ("b" in cache, "a" in cache, len(cache)) == (False, True, 2)
    assert cache.get("b", "missing") == "missing"
    cache.clear()
    assert len(cache) == 0


def test_seen_is_true_once_per_key_within_its_bound():
    seen = Seen(2)
    assert [seen.first("a"), seen.first("a"), seen.first("b")] == [True, False, True]
    seen.first("c")  # "a" is the oldest: forgotten
    assert ("a" in seen, "c" in seen) == (False, True)
    assert seen.first("a")
    seen.clear()
    assert len(seen) == 0 and seen.first("c")
