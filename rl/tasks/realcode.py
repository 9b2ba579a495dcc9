"""Real-code tasks: one mutation bug in a pinned sdist, graded by the sdist's own tests.

A real-code task's starting workspace is an unpacked sdist (``SdistSource``:
``name==version`` and the archive's sha256) plus ``source.patch``: one bug
from :mod:`rl.tasks.mutations` (a swapped operator or a nudged constant in
one function). The reference solution is the reverse patch. The grader runs
the package's failing test file with the project interpreter
(``interpreter: "project"``: pytest, made visible read-only in the sandbox
by :func:`rl.tasks.grading.grader_sandbox`), and every test directory of the
package is restored before grading, so a rollout cannot pass by editing tests.

:func:`draft_tasks` finds the tasks: for each sdist it fetches the archive
(cached: :func:`rl.tasks.workspaces.fetch_sdist`), finds the package and its
test directories (:func:`sdist_layout`), runs the whole test suite in the
sandbox (it must pass unmodified, else the package is dropped with the
reason), then tries mutations one at a time in the sandbox and keeps the
ones the tests catch, naming the first failing test in the request. The
caller (:func:`rl.tasks.build.build_task_set`) then validates each draft like
every task (fails at start, passes with the reference).

Splits: one candidate mutation per function, drawn with a seed from
``(seed, name, version)``; the first drafts of a package go to the training
split, the next to the held-out split, so the two splits never mutate the
same function. Not guaranteed: unlike the procedural families, the held-out
split shares the package's vocabulary with the training split (it measures
fixing unseen functions of a known package; pass held-out-only sdists for
unseen packages). A mutation that only breaks at import time is kept when a
test fails on it (the request then names an import error). Test suites that
need extra dependencies or the network fail the baseline and are dropped.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from random import Random

from rl.tasks.families import patch_between
from rl.tasks.grading import GraderConfig, grade
from rl.tasks.mutations import Mutation, enumerate_mutations, failure_query
from rl.tasks.spec import Grader, SdistSource, Task
from rl.tasks.workspaces import TaskSourceError, check_sdist_name, fetch_sdist, sha256_file, unpack_sdist
from rl.types import SPLIT_SEED_OFFSET, Split
from tools.sandbox import Sandbox
from tools.workspace import Workspace, WorkspaceStore

__all__ = ["REALCODE", "SdistLayout", "SdistPin", "draft_tasks", "find_layout", "grader_command", "parse_pins",
           "sdist_layout"]

REALCODE = "realcode"
TEST_DIR_NAMES = ("tests", "test")
GRADER_TIMEOUT_S = 120.0
_SHA = re.compile(r"[0-9a-f]{64}")
_KIND_DIFFICULTY = {"constant": 1, "compare": 2, "binop": 2, "boolop": 3}  # rough: how visible the slip is


@dataclass(frozen=True, slots=True)
class SdistPin:
    """``name==version``, optionally pinned to the archive's sha256 (else pinned on first fetch)."""

    name: str
    version: str
    sha256: str | None = None

    @classmethod
    def parse(cls, spec: str) -> SdistPin:
        """``NAME==VERSION`` or ``NAME==VERSION@sha256:HEX`` (a clear ``ValueError`` otherwise)."""
        body, _, sha = spec.strip().partition("@sha256:")
        name, sep, version = body.partition("==")
        if not sep or not name or not version:
            raise ValueError(f"sdist {spec!r}: expected NAME==VERSION[@sha256:HEX], e.g. toolz==1.0.0")
        if sha and not _SHA.fullmatch(sha):
            raise ValueError(f"sdist {spec!r}: the sha256 must be 64 lowercase hex digits")
        try:
            check_sdist_name(name, version)
        except TaskSourceError as exc:
            raise ValueError(str(exc)) from None
        return cls(name, version, sha or None)


def parse_pins(specs: Sequence[str]) -> list[SdistPin]:
    return [SdistPin.parse(s) for s in specs if s.strip()]


@dataclass(frozen=True, slots=True)
class SdistLayout:
    """Where things are in an unpacked sdist (paths relative to its root, '/'-separated)."""

    package_dir: str  # "toolz" or "src/math_x"
    import_dir: str  # what goes on PYTHONPATH: "." or "src"
    tests_dir: str  # the main test directory ("tests", "toolz/tests")
    test_dirs: tuple[str, ...]  # every test directory (restored before grading)
    sources: tuple[str, ...]  # the package's .py files outside every test directory: what may be mutated


def _is_test_path(rel: str) -> bool:
    return any(p in TEST_DIR_NAMES for p in rel.split("/"))


def sdist_layout(root: Path, name: str) -> SdistLayout:
    """The layout of the tree at ``root`` for distribution ``name`` (``more-itertools`` ->
    ``more_itertools``; flat or ``src/`` layout). :class:`TaskSourceError` when the package
    or its tests are missing."""
    mod = name.replace("-", "_").replace(".", "_").lower()
    for cand in (root / mod, root / "src" / mod):
        if (cand / "__init__.py").is_file():
            pkg = cand.relative_to(root).as_posix()
            break
    else:
        raise TaskSourceError(f"sdist {name}: no package directory {mod}/ or src/{mod}/ with an __init__.py")
    main = next((c for c in ("tests", "test", f"{pkg}/tests", f"{pkg}/test") if (root / c).is_dir()), None)
    if main is None:
        raise TaskSourceError(f"sdist {name}: ships no tests directory (tests/, test/ or {pkg}/tests/)")
    dirs = {main}
    for base in (root / pkg, root / "tests", root / "test"):
        if base.is_dir():
            dirs.update(p.relative_to(root).as_posix() for p in base.rglob("*")
                        if p.is_dir() and p.name in TEST_DIR_NAMES and "__pycache__" not in p.parts)
    # keep only outermost directories (restoring toolz/tests covers toolz/tests/x/tests)
    outer = sorted(d for d in dirs if not any(d != o and d.startswith(o + "/") for o in dirs))
    sources = sorted(p.relative_to(root).as_posix() for p in (root / pkg).rglob("*.py")
                     if "__pycache__" not in p.parts and not _is_test_path(p.relative_to(root / pkg).as_posix()))
    return SdistLayout(pkg, Path(pkg).parent.as_posix(), main, tuple(outer), tuple(sources))


def find_layout(root: Path, name: str) -> tuple[str, str]:
    """(package dir, main test dir): the search benchmark's view of :func:`sdist_layout`."""
    lay = sdist_layout(root, name)
    return lay.package_dir, lay.tests_dir


def grader_command(layout: SdistLayout, tests: Sequence[str]) -> str:
    """pytest on ``tests`` with ``{python}``; third-party plugins off (only pytest itself is assumed),
    no cache or bytecode written into the workspace, stop at the first failure."""
    return (f"PYTHONDONTWRITEBYTECODE=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONPATH={shlex.quote(layout.import_dir)} "
            "{python} -m pytest -x -q --tb=short -p no:cacheprovider "
            + " ".join(shlex.quote(t) for t in tests))


def _task(pin: SdistPin, sha: str, layout: SdistLayout, m: Mutation, original: str, *, split: Split, seed: int,
          k: int, tests: Sequence[str], request: str, failing: str | None) -> Task:
    return Task(
        id=f"{REALCODE}-{pin.name}-{pin.version}-{split.value}-{seed}-{k}", family=REALCODE, split=split,
        difficulty=_KIND_DIFFICULTY.get(m.kind, 2), seed=seed, request=request,
        source=SdistSource(name=pin.name, version=pin.version, sha256=sha,
                           patch=patch_between({m.path: original}, {m.path: m.new_source})),
        grader=Grader(command=grader_command(layout, tests), test_files=list(layout.test_dirs),
                      interpreter="project", timeout_s=GRADER_TIMEOUT_S),
        reference_patch=patch_between({m.path: m.new_source}, {m.path: original}),
        metadata={"package": pin.name, "version": pin.version, "path": m.path, "symbol": m.symbol,
                  "mutation": m.description, "kind": m.kind, "failing_test": failing},
    )


def _request(pin: SdistPin, failing: str, output: str) -> str:
    detail = failure_query(output) or failing
    what = f"Its test {failing} fails" if "::" in failing else f"Collecting the tests in {failing} fails"
    return (f"The workspace is the source of {pin.name} {pin.version}. {what}:\n\n{detail}\n\n"
            "Find the bug in the package's code and fix it. Do not change the tests.")


def _first_failure(output: str) -> str | None:
    m = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.M)
    return m.group(1) if m else None


def _prepare(pin: SdistPin, archive: Path, seed: int, store: WorkspaceStore,
             ) -> tuple[SdistLayout, dict[str, str], list[Mutation], Workspace]:
    """Unpack, find the layout, draw the candidate mutations, and make the unmodified base workspace."""
    with tempfile.TemporaryDirectory(prefix="flywheel-realcode-") as tmp:
        root = unpack_sdist(archive, Path(tmp) / "u")
        layout = sdist_layout(root, pin.name)
        sources = {rel: (root / rel).read_text(encoding="utf-8") for rel in layout.sources}
        rng = Random(f"{seed}:{pin.name}=={pin.version}")  # str seeds are hashed deterministically
        candidates = enumerate_mutations(root, layout.sources, rng)
        return layout, sources, candidates, store.from_dir(root)


async def _draft_one(pin: SdistPin, counts: dict[Split, int], seed: int, *, sandbox: Sandbox,
                     store: WorkspaceStore, cache_dir: Path, config: GraderConfig | None,
                     max_tries: int, progress: Callable[[str], None] | None) -> list[Task]:
    archive = await asyncio.to_thread(fetch_sdist, pin.name, pin.version, cache_dir, sha256=pin.sha256)
    sha = pin.sha256 or sha256_file(archive)
    layout, sources, candidates, base = await asyncio.to_thread(_prepare, pin, archive, seed, store)
    try:
        plan = [s for s in (Split.TRAIN, Split.HELDOUT, Split.VALIDATION) for _ in range(counts.get(s, 0))]
        if not plan:
            return []
        everything = list(layout.test_dirs)
        probe_ref = "(the reverse of source.patch)"
        # the unmodified suite must pass, or no mutation result means anything
        probe = Task(id=f"{REALCODE}-{pin.name}-baseline", family=REALCODE, split=Split.TRAIN, difficulty=1,
                     seed=seed, request="baseline", source=SdistSource(name=pin.name, version=pin.version,
                                                                       sha256=sha),
                     grader=Grader(command=grader_command(layout, everything), test_files=everything,
                                   interpreter="project", timeout_s=GRADER_TIMEOUT_S),
                     reference_patch=probe_ref)
        res = await grade(probe, base, sandbox, config=config)
        if res.error or not res.passed:
            raise TaskSourceError(f"sdist {pin.name}=={pin.version}: its unmodified tests do not pass in the "
                                  f"sandbox ({res.error or res.output[-600:]})")
        out: list[Task] = []
        for tries, m in enumerate(candidates):
            if len(out) >= len(plan) or tries >= max_tries:
                break
            fork = await asyncio.to_thread(base.fork)
            try:
                await asyncio.to_thread((Path(fork.root) / m.path).write_text, m.new_source, encoding="utf-8")
                res = await grade(probe, fork, sandbox, config=config)
            finally:
                await asyncio.to_thread(fork.delete)
            failing = None if res.error or res.passed else _first_failure(res.output)
            if progress is not None:
                progress(f"{pin.name} {m.path} {m.description}: "
                         + ("caught by " + failing if failing else "not caught" if res.passed else "no test named"))
            if failing is None:
                continue
            split = plan[len(out)]
            k = sum(1 for t in out if t.split is split)
            tests = [failing.split("::")[0]]
            out.append(_task(pin, sha, layout, m, sources[m.path], split=split, seed=seed * 1_000_000
                             + SPLIT_SEED_OFFSET[split] + k, k=k, tests=tests, request=_request(pin, failing, res.output),
                             failing=failing))
        return out
    finally:
        await asyncio.to_thread(base.delete)


async def draft_tasks(pins: Sequence[SdistPin], n_train: int, n_heldout: int, seed: int, *, sandbox: Sandbox,
                      store: WorkspaceStore, cache_dir: Path, config: GraderConfig | None = None,
                      tries_per_task: int = 4, progress: Callable[[str], None] | None = None,
                      n_validation: int = 0) -> tuple[list[Task], list[tuple[str, str]]]:
    """Up to ``n_train`` + ``n_heldout`` + ``n_validation`` drafts spread over ``pins`` (not yet validated), and
    ``(sdist, reason)`` for each package that could not be used. A package gets
    ``n // len(pins)`` tasks per split (the first ones one more) and tries at most
    ``tries_per_task`` mutations per task it owes: fewer may come back (not guaranteed to fill)."""
    drafts: list[Task] = []
    dropped: list[tuple[str, str]] = []
    for j, pin in enumerate(pins):
        counts = {s: n // len(pins) + (j < n % len(pins))
                  for s, n in ((Split.TRAIN, n_train), (Split.HELDOUT, n_heldout), (Split.VALIDATION, n_validation))}
        owed = sum(counts.values())
        try:
            drafts += await _draft_one(pin, counts, seed, sandbox=sandbox, store=store, cache_dir=cache_dir,
                                       config=config, max_tries=tries_per_task * owed + 4, progress=progress)
        except (TaskSourceError, OSError, UnicodeDecodeError, SyntaxError) as exc:
            dropped.append((f"{pin.name}=={pin.version}", f"{type(exc).__name__}: {exc}"[:1000]))
    return drafts, dropped

