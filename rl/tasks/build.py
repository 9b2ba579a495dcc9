"""Build a task set: generate, validate every task, write the JSONL atomically.

``flywheel rl tasks build --families fix_bug,rename --n-train N --n-heldout M
[--n-validation V] --seed S --out FILE`` calls :func:`build_task_set`. Task ``i``
of a split gets the seed ``S * 1_000_000 + i`` (train), ``S * 1_000_000 +
500_000 + i`` (held-out) or ``S * 1_000_000 + 750_000 + i`` (validation):
seeds never repeat across splits, and the vocabularies differ too
(:mod:`rl.tasks.vocab`). Families take turns; difficulty cycles 1..3. The
validation split is built after the other two, so adding it leaves their
tasks as they were.

Validation (:func:`validate`) builds the starting workspace and grades it in
the sandbox: the grader must *fail* without error there, then *pass* on a
fork with the reference patch applied. Tasks that fail validation are
dropped and counted (``dropped`` in the summary, with reasons); the file is
written to a temporary name and renamed, so an interrupted build leaves
nothing half-written.

Real-code tasks (family ``realcode``, :mod:`rl.tasks.realcode`): ``--families
realcode --sdists toolz==1.0.0,...`` (mixable with the procedural families,
which then take turns with it). The slots the plan gives ``realcode`` are
filled with mutation bugs drafted from the sdists (cached in ``cache_dir``)
and validated like every task; their graders use the project interpreter, so
``sandbox`` must expose it (:func:`rl.tasks.grading.grader_sandbox`
``(project=True)``), or every such task is dropped naming that. A package
that cannot be used (download, no tests, a failing unmodified suite) is
dropped and counted with its reason.

Not guaranteed: a dropped task is not replaced, so a split may hold fewer
than asked (the summary says how many).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rl.tasks.families import FAMILIES, MAX_DIFFICULTY, UNITTEST, generate, patch_between
from rl.tasks.grading import GraderConfig, grade
from rl.tasks.realcode import REALCODE, draft_tasks, parse_pins
from rl.tasks.spec import GeneratedSource, Grader, Task, write_tasks
from rl.tasks.workspaces import TaskSourceError, apply_patch, default_sdist_cache, materialise
from rl.types import SPLIT_SEED_OFFSET, Split
from tools.sandbox import Sandbox
from tools.workspace import WorkspaceStore

__all__ = ["BuildSummary", "build_task_set", "make_task", "plan", "validate"]


def make_task(family: str, split: Split, seed: int, difficulty: int) -> Task:
    d = generate(family, split, seed, difficulty)
    return Task(
        id=f"{family}-{split.value}-{seed}-d{difficulty}", family=family, split=split, difficulty=difficulty,
        seed=seed, request=d.request, source=GeneratedSource(files=d.files),
        grader=Grader(command=UNITTEST, test_files=d.test_files, timeout_s=30.0),
        reference_patch=patch_between(d.files, d.solution), metadata=dict(d.metadata),
    )


def plan(families: Sequence[str], n_train: int, n_heldout: int, seed: int, *,
         sdists: Sequence[str] = (), n_validation: int = 0) -> list[tuple[str, Split, int, int]]:
    """(family, split, seed, difficulty) for every task to build (``realcode`` slots are filled
    from ``sdists``, which it then requires: ``NAME==VERSION[@sha256:HEX]``)."""
    unknown = [f for f in families if f not in FAMILIES and f != REALCODE]
    if unknown or not families:
        raise ValueError(f"unknown task families {unknown}; known: {', '.join((*FAMILIES, REALCODE))}")
    if REALCODE in families and not parse_pins(sdists):
        raise ValueError("the realcode family needs sdists to mutate: --sdists NAME==VERSION[,...] "
                         "(e.g. toolz==1.0.0)")
    out = []
    for split, n in ((Split.TRAIN, n_train), (Split.HELDOUT, n_heldout), (Split.VALIDATION, n_validation)):
        if n > 250_000:
            raise ValueError(f"{n} {split.value} tasks: at most 250,000 per split (their seeds would repeat)")
        for i in range(n):
            out.append((families[i % len(families)], split, seed * 1_000_000 + SPLIT_SEED_OFFSET[split] + i,
                        1 + (i // len(families)) % MAX_DIFFICULTY))
    return out


async def validate(task: Task, store: WorkspaceStore, sandbox: Sandbox, *, cache_dir: Path | None = None,
                   config: GraderConfig | None = None) -> str | None:
    """None when ``task`` is valid, else why not."""
    try:
        ws = await asyncio.to_thread(materialise, task, store, cache_dir=cache_dir)
    except (TaskSourceError, OSError, ValueError) as exc:
        return f"starting workspace: {exc}"
    try:
        start = await grade(task, ws, sandbox, config=config)
        if start.error:
            return f"grader on the starting state: {start.error}"
        if start.passed:
            return "grader passes on the starting state (nothing to do)"
        solved = await asyncio.to_thread(ws.fork)
        try:
            try:
                await asyncio.to_thread(apply_patch, solved.root, task.reference_patch, what="reference_patch")
            except TaskSourceError as exc:
                return str(exc)
            ref = await grade(task, solved, sandbox, config=config)
        finally:
            await asyncio.to_thread(solved.delete)
        if ref.error:
            return f"grader with the reference patch: {ref.error}"
        if not ref.passed:
            return f"grader fails with the reference patch: {ref.output[-300:]}"
        return None
    finally:
        await asyncio.to_thread(ws.delete)


@dataclass(slots=True)
class BuildSummary:
    written: Counter[str] = field(default_factory=Counter)  # per split
    families: Counter[str] = field(default_factory=Counter)
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (task id, reason)

    def to_json(self) -> dict[str, object]:
        return {"written": dict(self.written), "families": dict(self.families), "dropped": len(self.dropped),
                "dropped_reasons": [{"task": t, "reason": r} for t, r in self.dropped]}


async def build_task_set(
    families: Sequence[str], n_train: int, n_heldout: int, seed: int, out: Path, *, sandbox: Sandbox,
    concurrency: int = 2, progress: Callable[[Task, str | None], None] | None = None,
    sdists: Sequence[str] = (), cache_dir: Path | None = None, config: GraderConfig | None = None,
    n_validation: int = 0,
) -> BuildSummary:
    """Generate, validate and write the set to ``out``; see the module docstring.
    ``cache_dir`` caches the downloaded sdists (default :func:`rl.tasks.workspaces.default_sdist_cache`)."""
    jobs = plan(families, n_train, n_heldout, seed, sdists=sdists, n_validation=n_validation)
    real = Counter(split for fam, split, _, _ in jobs if fam == REALCODE)
    jobs = [j for j in jobs if j[0] != REALCODE]
    summary = BuildSummary()
    with tempfile.TemporaryDirectory(prefix="flywheel-tasks-") as tmp:
        store = WorkspaceStore(Path(tmp))
        tasks: list[Task] = [make_task(*j) for j in jobs]
        if real:
            drafts, unusable = await draft_tasks(parse_pins(sdists), real[Split.TRAIN], real[Split.HELDOUT], seed,
                                                 n_validation=real[Split.VALIDATION],
                                                 sandbox=sandbox, store=store, config=config,
                                                 cache_dir=cache_dir or default_sdist_cache())
            tasks += drafts
            summary.dropped += unusable
        kept: list[Task | None] = [None] * len(tasks)
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int, task: Task) -> None:
            async with gate:
                why = await validate(task, store, sandbox, cache_dir=cache_dir, config=config)
            if why is None:
                kept[i] = task
            else:
                summary.dropped.append((task.id, why))
            if progress is not None:
                progress(task, why)

        await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks)))
    tasks = [t for t in kept if t is not None]
    for t in tasks:
        summary.written[t.split.value] += 1
        summary.families[t.family] += 1
    write_tasks(out, tasks)
    return summary
