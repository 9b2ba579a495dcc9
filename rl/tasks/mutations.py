"""Mutation bugs: inject one small, test-detectable bug into real Python code.

The one implementation behind both the search evaluation
(``benchmarks/search_quality.py``, ``benchmarks/fusion_tune.py``, through
``benchmarks/_search_eval.py``) and RL's real-code tasks (:mod:`rl.tasks.realcode`).

A mutation swaps one operator (``<`` -> ``<=``, ``+`` -> ``-``, ``and`` -> ``or``)
or nudges one integer constant, inside one function, on one line, keeping the
rest of the file byte for byte. :func:`enumerate_mutations` draws one
candidate site per function with the caller's ``random.Random``, so a seed
pins the candidates.

Not guaranteed: a mutation changes behaviour (an equivalent mutant such as
``x * 1`` -> ``x // 1`` survives); callers keep only mutations the tests
catch. Multi-line expressions are skipped.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from random import Random

__all__ = ["Mutation", "enumerate_mutations", "failure_query", "functions", "run_tests"]

_CMP_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
             ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
_BIN_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult,
             ast.Mod: ast.FloorDiv}

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def functions(tree: ast.AST) -> Iterator[tuple[str, FunctionNode]]:
    """(qualname, node) for every function and method, nested ones included."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, FunctionNode]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                q = f"{prefix}{child.name}"
                yield q, child
                yield from walk(child, q + ".")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


@dataclass(frozen=True, slots=True)
class Mutation:
    path: str  # relative to the tree's root, '/'-separated
    symbol: str  # qualified name of the mutated function
    start_line: int
    end_line: int
    lineno: int
    kind: str  # "compare" | "binop" | "boolop" | "constant"
    description: str  # "line 12: a < b -> a <= b"
    new_source: str  # the whole mutated file


def _mutation_sites(fn: ast.AST) -> list[tuple[ast.AST, str]]:
    sites: list[tuple[ast.AST, str]] = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Compare) and type(node.ops[0]) in _CMP_SWAP:
            sites.append((node, "compare"))
        elif isinstance(node, ast.BinOp) and type(node.op) in _BIN_SWAP:
            sites.append((node, "binop"))
        elif isinstance(node, ast.BoolOp):
            sites.append((node, "boolop"))
        elif isinstance(node, ast.Constant) and type(node.value) is int and not isinstance(node.value, bool):
            sites.append((node, "constant"))
    return sites


def enumerate_mutations(root: Path, rel_files: Iterable[str], rng: Random) -> list[Mutation]:
    """One candidate mutation per function (a random site in it, not in a nested function), shuffled."""
    out: list[Mutation] = []
    for rel in rel_files:
        text = (root / rel).read_text(encoding="utf-8")
        tree = ast.parse(text)
        for qual, fn in functions(tree):
            sites = [s for s in _mutation_sites(fn) if not any(
                isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)) and inner is not fn
                and inner.lineno <= getattr(s[0], "lineno", 0) <= (inner.end_lineno or 0) for inner in ast.walk(fn))]
            if not sites:
                continue
            node, kind = sites[rng.randrange(len(sites))]
            mutated = apply_mutation(text, node, kind)
            if mutated is None:
                continue
            new_source, desc = mutated
            out.append(Mutation(rel, qual, fn.lineno, fn.end_lineno or fn.lineno, getattr(node, "lineno", 0),
                                kind, desc, new_source))
    rng.shuffle(out)
    return out


def apply_mutation(text: str, target: ast.AST, kind: str) -> tuple[str, str] | None:
    """``text`` with ``target`` (a node of ``ast.parse(text)``'s shape) mutated, and a description;
    None for a node spanning several lines or not found."""
    tree = ast.parse(text)
    lineno, col = getattr(target, "lineno", None), getattr(target, "col_offset", None)
    for node in ast.walk(tree):
        if type(node) is type(target) and getattr(node, "lineno", None) == lineno and \
                getattr(node, "col_offset", None) == col:
            break
    else:
        return None
    before = ast.unparse(node)
    if kind == "compare":
        assert isinstance(node, ast.Compare)
        node.ops[0] = _CMP_SWAP[type(node.ops[0])]()
    elif kind == "binop":
        assert isinstance(node, ast.BinOp)
        node.op = _BIN_SWAP[type(node.op)]()
    elif kind == "boolop":
        assert isinstance(node, ast.BoolOp)
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    else:
        assert isinstance(node, ast.Constant) and isinstance(node.value, int)
        node.value = node.value + 1 if node.value in (0, 1) else node.value - 1
    after = ast.unparse(node)
    # replace only the mutated expression's text span, keeping the rest of the file as written
    lines = text.splitlines(keepends=True)
    if lineno is None or lineno != getattr(target, "end_lineno", None):
        return None  # multi-line expressions: skip (keeps the edit textual and small)
    line = lines[lineno - 1]
    end_col = getattr(target, "end_col_offset", None)
    lines[lineno - 1] = line[:col] + after + line[end_col:]
    return "".join(lines), f"line {lineno}: {before} -> {after}"


def run_tests(root: Path, test_dir: str, *, timeout: float = 60.0, import_dir: str = ".") -> tuple[bool, str]:
    """Run a tree's tests with pytest on the host (stop at the first failure). Returns (passed, output).

    ``import_dir``: where the package is imported from, relative to ``root``
    (``src`` for a src layout). Host-side and unsandboxed: for the search
    benchmark's trusted, unmodified sdists only. RL grades model-edited
    trees in the sandbox (:mod:`rl.tasks.grading`), never with this.
    """
    path = os.pathsep.join(dict.fromkeys([str(root / import_dir), str(root)]))
    env = {**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        p = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "--tb=short", "-p", "no:cacheprovider",
                            "-p", "no:randomly", test_dir], cwd=root, env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return False, "TIMEOUT " + (exc.stdout or "")[-2000:] if isinstance(exc.stdout, str) else "TIMEOUT"
    return p.returncode == 0, p.stdout + p.stderr


def failure_query(output: str, max_chars: int = 600) -> str | None:
    """What a developer would paste: the failing test's name and the error lines (``E ...``)."""
    name = None
    for line in output.splitlines():
        m = re.match(r"(FAILED|ERROR) (\S+)", line)
        if m:
            name = m.group(2)
            break
    if name is None:
        return None
    errors = [ln[1:].strip() for ln in output.splitlines() if ln.startswith("E ")]
    q = name.replace("::", " ") + "\n" + "\n".join(errors)
    return q[:max_chars]
