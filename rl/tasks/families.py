"""Procedural task families sized for a CPU-scale model (1024-token context).

Each family turns ``(split, seed, difficulty)`` into a small project (files
of a few dozen lines), a request, unittest tests (the sandbox's
``/usr/bin/python3`` has no pytest) and the reference solution. Names come
from the split's word list (:mod:`rl.tasks.vocab`), drawn with
``random.Random(f"{family}:{split}:{seed}:{difficulty}")``, so the same
arguments give the same task on every run and machine.

* ``fix_bug`` — a failing test points at a bug: off-by-one, wrong operator
  or wrong constant. Difficulty adds functions and files (more to read) and
  at 3 the request no longer names the function.
* ``rename`` — rename a function across the files that define, import and
  call it (difficulty: 1-3 using files).
* ``find_change`` — find the file (among 2-6, in nested directories) that
  defines a constant and change its value.
* ``implement_stub`` — implement a function specified by its docstring and test.

Not guaranteed: tasks are validated (grader fails at the start, passes with
the reference) only by :mod:`rl.tasks.build`, not here.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from rl.tasks.vocab import words_for
from rl.types import Split
from tools.diffs import unified_diff

__all__ = ["FAMILIES", "Draft", "UNITTEST", "generate", "patch_between"]

UNITTEST = "{python} -m unittest discover -s tests -t . -q"


@dataclass(slots=True)
class Draft:
    """A generated task before validation: start files, solution files (changed ones only)."""

    request: str
    files: dict[str, str]
    solution: dict[str, str | None]  # path -> new text, None to delete
    test_files: list[str]
    metadata: dict[str, object] = field(default_factory=dict)


class _Names:
    """Distinct names from one split's words."""

    def __init__(self, rng: random.Random, words: tuple[str, ...]) -> None:
        self.rng, self.words, self.used = rng, list(words), set[str]()
        self.order: list[str] = []

    def word(self) -> str:
        free = [w for w in self.words if w not in self.used]
        if not free:
            raise ValueError("the word list is too short for this difficulty")
        w = self.rng.choice(free)
        self.used.add(w)
        self.order.append(w)
        return w

    def ident(self, parts: int = 2) -> str:
        return "_".join(self.word() for _ in range(parts))


def patch_between(files: dict[str, str], solution: dict[str, str | None]) -> str:
    """The unified diff (git style) that turns ``files`` into ``files`` updated by ``solution``, one
    file after another in ``solution``'s order (the order the family wrote them: unlike sorting by
    path, it survives renaming, :mod:`rl.train.rename`)."""
    out = []
    for path in solution:
        old = files.get(path)
        new = solution[path]
        out.append(unified_diff(path, None if old is None else old.encode(), None if new is None else new.encode()))
    return "".join(out)


_TEST_HEAD = "import unittest\n\n"
_TEST_TAIL = "\n\nif __name__ == \"__main__\":\n    unittest.main()\n"

# (correct body, buggy body, kind, test cases) with {f} the function name; bodies take (x, lo, hi) or (n)
_BUGS: list[tuple[str, str, str, str, list[tuple[str, str]]]] = [
    ("n", "    total = 0\n    for i in range(1, n + 1):\n        total += i\n    return total\n",
     "    total = 0\n    for i in range(1, n):\n        total += i\n    return total\n", "off-by-one",
     [("4", "10"), ("1", "1")]),
    ("x, lo, hi", "    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n    return x\n",
     "    if x < lo:\n        return lo\n    if x < hi:\n        return hi\n    return x\n", "wrong operator",
     [("5, 0, 10", "5"), ("12, 0, 10", "10")]),
    ("x", "    return x * 60\n", "    return x * 61\n", "wrong constant", [("2", "120"), ("0", "0")]),
    ("values, limit", "    return len([v for v in values if v >= limit])\n",
     "    return len([v for v in values if v > limit])\n", "wrong operator", [("[1, 2, 3], 2", "2")]),
    ("values", "    return values[len(values) - 1]\n", "    return values[len(values) - 2]\n", "off-by-one",
     [("[4, 5, 6]", "6"), ("[7]", "7")]),
]
_FILLERS = [("values", "    return sorted(values)[0]\n", [("[3, 1, 2]", "1")]),
            ("x", "    return x + 1\n", [("1", "2")]),
            ("n", "    return [i * i for i in range(n)]\n", [("3", "[0, 1, 4]")])]


def _fn(name: str, args: str, body: str, doc: str = "") -> str:
    d = f'    """{doc}"""\n' if doc else ""
    return f"def {name}({args}):\n{d}{body}"


def _test_class(cls: str, cases: list[tuple[str, str, str]]) -> str:
    lines = [f"class {cls}(unittest.TestCase):"]
    for i, (fn, call, want) in enumerate(cases):
        lines.append(f"    def test_{fn}_{i}(self):\n        self.assertEqual({fn}({call}), {want})\n")
    return "\n".join(lines)


def fix_bug(rng: random.Random, names: _Names, difficulty: int) -> Draft:
    pkg = names.word()
    n_files = 1 if difficulty < 2 else 2
    mods = [names.word() for _ in range(n_files)]
    args, good, bad, kind, cases = rng.choice(_BUGS)
    target_mod = rng.choice(mods)
    target = names.ident()
    bodies: dict[str, list[str]] = {m: [] for m in mods}
    tests: list[tuple[str, str, str, str]] = []  # (module, fn, call, want)
    for m in mods:
        for _ in range(difficulty - 1):
            fargs, fbody, fcases = rng.choice(_FILLERS)
            fname = names.ident()
            bodies[m].append(_fn(fname, fargs, fbody))
            tests += [(m, fname, c, w) for c, w in fcases]
    files: dict[str, str] = {f"{pkg}/__init__.py": "", "tests/__init__.py": ""}
    solution: dict[str, str | None] = {}
    for m in mods:
        fns = list(bodies[m])
        if m == target_mod:
            pos = rng.randrange(len(fns) + 1)
            start, fixed = [*fns[:pos], _fn(target, args, bad), *fns[pos:]], [*fns[:pos], _fn(target, args, good), *fns[pos:]]
            files[f"{pkg}/{m}.py"] = "\n\n".join(start)
            solution[f"{pkg}/{m}.py"] = "\n\n".join(fixed)
        else:
            files[f"{pkg}/{m}.py"] = "\n\n".join(fns)
    tests += [(target_mod, target, c, w) for c, w in cases]
    test_path = f"tests/test_{pkg}.py"
    imports = "".join(f"from {pkg}.{m} import {', '.join(dict.fromkeys(fn for mm, fn, _, _ in tests if mm == m))}\n"
                      for m in mods if any(mm == m for mm, *_ in tests))
    body = _test_class(f"Test{pkg.title()}", [(fn, c, w) for _, fn, c, w in tests])
    files[test_path] = _TEST_HEAD + imports + "\n\n" + body + _TEST_TAIL
    where = f"`{target}` in {pkg}/{target_mod}.py" if difficulty == 1 else f"`{target}`" if difficulty == 2 else "the code"
    request = f"The tests in {test_path} fail. Find and fix the bug in {where} (do not change the tests)."
    return Draft(request, files, solution, [test_path, "tests/__init__.py"], {"bug": kind, "function": target})


def rename(rng: random.Random, names: _Names, difficulty: int) -> Draft:
    pkg, core = names.word(), names.word()
    old, new = names.ident(), names.ident()
    users = [names.word() for _ in range(difficulty)]
    files: dict[str, str] = {f"{pkg}/__init__.py": "", "tests/__init__.py": ""}
    solution: dict[str, str | None] = {}
    core_src = _fn(old, "x", "    return x * 2 + 1\n", "Twice x, plus one.")
    files[f"{pkg}/{core}.py"] = core_src
    solution[f"{pkg}/{core}.py"] = core_src.replace(old, new)
    callers: list[tuple[str, str]] = []
    for u in users:
        caller = names.ident()
        callers.append((u, caller))
        src = f"from {pkg}.{core} import {old}\n\n\n" + _fn(caller, "values", f"    return [{old}(v) for v in values]\n")
        files[f"{pkg}/{u}.py"] = src
        solution[f"{pkg}/{u}.py"] = src.replace(old, new)
    test_path = "tests/test_rename.py"
    imports = f"import os\n\nfrom {pkg}.{core} import {new}\n" + "".join(
        f"from {pkg}.{u} import {c}\n" for u, c in callers)
    checks = "\n".join(f"        self.assertEqual({c}([1, 2]), [3, 5])" for _, c in callers)
    files[test_path] = _TEST_HEAD + imports + f"""

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class TestRename(unittest.TestCase):
    def test_new_name(self):
        self.assertEqual({new}(3), 7)
{checks}

    def test_old_name_gone(self):
        for root, dirs, files in os.walk(os.path.join(ROOT, "{pkg}")):
            for name in files:
                if name.endswith(".py"):
                    with open(os.path.join(root, name)) as f:
                        self.assertNotIn("{old}", f.read(), name)
""" + _TEST_TAIL
    request = f"Rename the function `{old}` to `{new}` everywhere in the {pkg} package (definition, imports, calls)."
    return Draft(request, files, solution, [test_path, "tests/__init__.py"], {"old": old, "new": new})


def find_change(rng: random.Random, names: _Names, difficulty: int) -> Draft:
    pkg = names.word()
    n = 2 * difficulty
    dirs = [pkg] + [f"{pkg}/{names.word()}" for _ in range(difficulty - 1)]
    consts = [(names.ident().upper(), rng.randrange(2, 90)) for _ in range(n)]
    files: dict[str, str] = {"tests/__init__.py": ""}
    for d in dirs:
        files[f"{d}/__init__.py"] = ""
    homes = [f"{rng.choice(dirs)}/{names.word()}.py" for _ in range(n)]
    for (c, v), home in zip(consts, homes, strict=True):
        files[home] = files.get(home, "") + f"{c} = {v}\n"
    (target, old), home = consts[0], homes[0]
    new_value = old + rng.randrange(3, 40)
    solution: dict[str, str | None] = {home: files[home].replace(f"{target} = {old}\n", f"{target} = {new_value}\n")}
    test_path = "tests/test_setting.py"
    # the test finds the definition itself, so it does not tell the model where it is
    files[test_path] = _TEST_HEAD + f"""import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def definitions(name):
    found = []
    for root, dirs, files in os.walk(os.path.join(ROOT, "{pkg}")):
        for fname in files:
            if fname.endswith(".py"):
                with open(os.path.join(root, fname)) as f:
                    for node in ast.parse(f.read()).body:
                        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == [name]:
                            found.append(ast.literal_eval(node.value))
    return found


class TestSetting(unittest.TestCase):
    def test_value(self):
        self.assertEqual(definitions("{target}"), [{new_value}])
""" + _TEST_TAIL
    request = f"Somewhere in this project the constant `{target}` is defined. Find it and change its value to {new_value}."
    return Draft(request, files, solution, [test_path, "tests/__init__.py"], {"constant": target, "file": home})


_STUBS: list[tuple[str, str, str, list[tuple[str, str]]]] = [
    ("values, limit", "Return how many of `values` are greater than `limit`.",
     "    return len([v for v in values if v > limit])\n", [("[1, 5, 7], 4", "2"), ("[], 0", "0")]),
    ("text", "Return `text` with its words in reverse order, separated by single spaces.",
     "    return \" \".join(reversed(text.split()))\n", [("'a b c'", "'c b a'"), ("'one'", "'one'")]),
    ("values, default", "Return the largest of `values`, or `default` when `values` is empty.",
     "    return max(values) if values else default\n", [("[3, 9, 2], 0", "9"), ("[], -1", "-1")]),
    ("text", "Return a dict mapping each word of `text` (split on whitespace) to how often it occurs.",
     "    counts = {}\n    for word in text.split():\n        counts[word] = counts.get(word, 0) + 1\n    return counts\n",
     [("'a b a'", "{'a': 2, 'b': 1}"), ("''", "{}")]),
]


def implement_stub(rng: random.Random, names: _Names, difficulty: int) -> Draft:
    pkg, mod = names.word(), names.word()
    picks = rng.sample(range(len(_STUBS)), min(difficulty, len(_STUBS)))
    fns = [(names.ident(), _STUBS[i]) for i in picks]
    target, (args, doc, body, cases) = fns[0]
    done = [_fn(n, a, b, d) for n, (a, d, b, _) in fns[1:]]  # the others come implemented, as examples
    start = "\n\n".join([_fn(target, args, "    raise NotImplementedError\n", doc), *done])
    solved = "\n\n".join([_fn(target, args, body, doc), *done])
    path = f"{pkg}/{mod}.py"
    files = {f"{pkg}/__init__.py": "", "tests/__init__.py": "", path: start}
    test_path = f"tests/test_{mod}.py"
    files[test_path] = _TEST_HEAD + f"from {pkg}.{mod} import {target}\n\n\n" + \
        _test_class(f"Test{mod.title()}", [(target, c, w) for c, w in cases]) + _TEST_TAIL
    request = f"Implement `{target}` in {path} as its docstring says; {test_path} tests it."
    return Draft(request, files, {path: solved}, [test_path, "tests/__init__.py"], {"function": target})


FAMILIES: dict[str, Callable[[random.Random, _Names, int], Draft]] = {
    "fix_bug": fix_bug, "rename": rename, "find_change": find_change, "implement_stub": implement_stub,
}
MAX_DIFFICULTY = 3


def generate(family: str, split: Split, seed: int, difficulty: int, *,
             words: tuple[str, ...] | None = None) -> Draft:
    """The draft for ``(family, split, seed, difficulty)``; deterministic. ``words`` replaces the
    split's word list (same length: the same structure with other names; :mod:`rl.train.rename`).
    The names drawn are in ``metadata["words"]``, in the order drawn."""
    if family not in FAMILIES:
        raise ValueError(f"unknown task family {family!r}; known: {', '.join(FAMILIES)}")
    if not 1 <= difficulty <= MAX_DIFFICULTY:
        raise ValueError(f"difficulty must be 1..{MAX_DIFFICULTY} (got {difficulty})")
    rng = random.Random(f"{family}:{split.value}:{seed}:{difficulty}")
    names = _Names(rng, words_for(split) if words is None else words)
    draft = FAMILIES[family](rng, names, difficulty)
    draft.metadata["words"] = list(names.order)
    return draft
