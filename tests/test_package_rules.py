"""The package rules of the architecture, checked on the source (ast, no imports run).

* Direction: each package imports only the packages the table allows
  (kernels -> -; tools -> embeddings; embeddings -> -; agent -> tools, kernels;
  rl -> agent, tools, embeddings; backend -> agent, tools, embeddings), and nothing
  imports backend/ or rl/ except the entry point (``backend/cli.py``). Imports at
  any depth count (module level, inside functions, under ``TYPE_CHECKING``): a
  deferred import is still a dependency.
* No import cycles among our modules, counting runtime imports (module level and
  function level); imports under ``if TYPE_CHECKING:`` are skipped there, since they
  never run.
* ``FLYWHEEL_*`` environment variables are read only by the pydantic-settings classes
  in ``backend/settings.py``: no ``os.environ``/``os.getenv`` lookup of a literal
  ``FLYWHEEL_...`` name anywhere else in the packages.

Not checked: imports built from strings (``importlib.import_module(name)``), and
environment reads through a variable holding the name.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "tools", "embeddings", "agent", "rl", "backend")
ALLOWED: dict[str, frozenset[str]] = {
    "kernels": frozenset(),
    "tools": frozenset({"embeddings"}),
    "embeddings": frozenset(),
    "agent": frozenset({"tools", "kernels"}),
    "rl": frozenset({"agent", "tools", "embeddings"}),
    "backend": frozenset({"agent", "tools", "embeddings"}),
}
ENTRY_POINTS = frozenset({"backend.cli", "backend.rl_cli"})  # may import anything of ours (rl_cli: only cli imports it)
ENTRY_ONLY = frozenset({"backend", "rl"})  # only entry points import these from outside
SETTINGS_MODULE = "backend.settings"


@dataclass(frozen=True, slots=True)
class Import:
    module: str  # the importing module
    path: Path
    line: int
    target: str  # the module imported (``from a.b import c`` -> a.b.c if that is a module, else a.b)
    type_only: bool  # under ``if TYPE_CHECKING:``


def modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = f.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(node: ast.AST, type_only: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.body:
                yield stmt, True
                yield from _walk(stmt, True)
            for stmt in child.orelse:
                yield stmt, type_only
                yield from _walk(stmt, type_only)
            continue
        yield child, type_only
        yield from _walk(child, type_only)


def imports(mods: dict[str, Path]) -> list[Import]:
    out: list[Import] = []
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node, type_only in _walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                subs = [f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in mods]
                targets = subs + ([source] if len(subs) < len(node.names) else [])
            for t in targets:
                if t.split(".")[0] in PACKAGES:
                    out.append(Import(mod, path, node.lineno, t, type_only))
    return out


def direction_violations(found: list[Import]) -> list[str]:
    bad = []
    for imp in found:
        src, dst = imp.module.split(".")[0], imp.target.split(".")[0]
        if src == dst or imp.module in ENTRY_POINTS:
            continue
        if dst in ENTRY_ONLY:
            why = f"nothing imports {dst}/ except entry points ({', '.join(sorted(ENTRY_POINTS))})"
        elif dst not in ALLOWED[src]:
            allowed = ", ".join(sorted(ALLOWED[src])) or "none of ours"
            why = f"{src}/ may import {allowed}"
        else:
            continue
        bad.append(f"{imp.path.relative_to(ROOT)}:{imp.line}: import {imp.target} ({why})")
    return bad


def cycles(mods: dict[str, Path], found: list[Import]) -> list[list[str]]:
    """Strongly connected components (more than one module) of the runtime import graph."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for imp in found:
        if not imp.type_only and imp.target in mods and imp.target != imp.module:
            edges[imp.module].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan; the graph is a few hundred modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(mods):
        if v not in index:
            visit(v)
    return out


def _literal(node: ast.expr, constants: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    return None


def _env_name(call: ast.Call, constants: dict[str, str]) -> str | None:
    """The variable name read by ``os.environ.get(X)``, ``os.getenv(X)``, ``environ.get(X)``,
    ``env.get(X)``, ``os.environ.setdefault(X, ..)``, where X is a literal or a module-level
    string constant; else None."""
    f = call.func
    if not (isinstance(f, ast.Attribute) and call.args):
        return None
    holder = f.value
    is_env = (f.attr in ("get", "setdefault", "pop") and (
        (isinstance(holder, ast.Attribute) and holder.attr == "environ")
        or (isinstance(holder, ast.Name) and holder.id in ("environ", "env"))))
    is_getenv = f.attr == "getenv" and isinstance(holder, ast.Name) and holder.id == "os"
    return _literal(call.args[0], constants) if (is_env or is_getenv) else None


def flywheel_env_reads(mods: dict[str, Path]) -> list[str]:
    bad = []
    for mod, path in mods.items():
        if mod == SETTINGS_MODULE:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        constants = {t.id: stmt.value.value for stmt in tree.body if isinstance(stmt, ast.Assign)
                     and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)
                     for t in stmt.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Call):
                name = _env_name(node, constants)
            elif isinstance(node, ast.Subscript) and (
                    isinstance(node.value, ast.Attribute) and node.value.attr == "environ"):
                name = _literal(node.slice, constants)
            if name and name.startswith("FLYWHEEL_"):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: reads ${name} (add a field to a "
                           f"settings class in backend/settings.py and pass the value in)")
    return bad


def test_package_import_direction() -> None:
    bad = direction_violations(imports(modules()))
    assert not bad, "imports against the package rules (ARCHITECTURE.md):\n" + "\n".join(bad)


def test_no_import_cycles_among_our_modules() -> None:
    mods = modules()
    found = cycles(mods, imports(mods))
    assert not found, "import cycles (runtime imports, function-level included):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_flywheel_env_vars_are_read_only_by_settings_classes() -> None:
    bad = flywheel_env_reads(modules())
    assert not bad, "FLYWHEEL_* read outside backend/settings.py:\n" + "\n".join(bad)


# -- the checks themselves catch what they must (on small synthetic trees) ----------------------------


def _tree(tmp: Path, files: dict[str, str]) -> dict[str, Path]:
    mods = {}
    for name, text in files.items():
        p = tmp / (name.replace(".", "/") + ".py")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        mods[name] = p
    return mods


def test_checks_see_function_level_imports_cycles_and_env_reads(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    mods = _tree(tmp_path, {
        "embeddings.a": "def f():\n    from backend.db import log\n",
        "agent.calls": "from agent.schema import g\n",
        "agent.schema": "def g():\n    from agent.calls import x\n",
        "tools.x": "import os\nV = os.environ.get('FLYWHEEL_SECRET')\n",
        "tools.w": "import os\nVAR = 'FLYWHEEL_UNSAFE'\ndef f(environ):\n    return environ.get(VAR) == '1'\n",
        "tools.y": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tools.x import V\n",
        "tools.z": "from tools.y import W\n",
    })
    found = imports(mods)
    assert direction_violations(found) == [
        "embeddings/a.py:2: import backend.db (nothing imports backend/ except entry points (backend.cli, backend.rl_cli))"]
    assert cycles(mods, found) == [["agent.calls", "agent.schema"]]
    assert sorted(b.split(":")[:2] for b in flywheel_env_reads(mods)) == [["tools/w.py", "4"], ["tools/x.py", "2"]]
