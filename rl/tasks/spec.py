"""Task sets: what a task is, and its JSONL file format.

A :class:`Task` is a starting workspace (:class:`GeneratedSource`: the files
themselves; :class:`GitSource`: a repository at a commit; :class:`SdistSource`:
an sdist pinned by ``name==version`` and the sha256 of the archive), each
optionally followed by ``patch`` (a unified diff applied after unpacking: a
real-code task's injected bug), the user's request, a :class:`Grader`, a
split, its family, difficulty and seed, free metadata, and the reference
solution as a unified diff (``reference_patch``).

A task set is a JSONL file, one task per line. Generated workspaces are
stored in the file (``files``: path -> text), not regenerated at load time,
so a task set rebuilds byte for byte whatever the generator code becomes;
``family``/``seed``/``difficulty`` record how it was made. Every model refuses
unknown keys (``extra="forbid"``); :func:`load_tasks` names the line and the
field of the first bad entry: ``tasks.jsonl:12: grader.command: Field required``.

Not guaranteed: loading does not check that a task is *valid* (its grader
fails on the start and passes with the reference): ``rl.tasks.build``
validates when it writes a set. A ``GitSource`` repository path is a host
path: such a task set rebuilds only where that repository exists.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rl.types import Split

__all__ = [
    "GeneratedSource", "GitSource", "Grader", "SdistSource", "Task", "TaskFileError", "load_tasks",
    "task_from_json", "write_tasks",
]

_HEX40 = re.compile(r"[0-9a-f]{40}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class TaskFileError(ValueError):
    """A task file (or one task) is malformed; the message names the line and field."""


def _rel_path(p: str) -> str:
    pp = PurePosixPath(p)
    if not p or pp.is_absolute() or ".." in pp.parts or "\\" in p or "\0" in p or str(pp) != p:
        raise ValueError(f"{p!r} is not a normalised relative path (no '..', no leading '/')")
    return p


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GeneratedSource(_Model):
    """A generated tree, stored in the task file: path -> UTF-8 text."""

    kind: Literal["generated"] = "generated"
    files: dict[str, str] = Field(min_length=1)
    patch: str = ""

    @field_validator("files")
    @classmethod
    def _paths(cls, v: dict[str, str]) -> dict[str, str]:
        for p in v:
            _rel_path(p)
        return v


class GitSource(_Model):
    """``repo`` (a host path or URL git can read) at the full 40-hex ``commit``."""

    kind: Literal["git"] = "git"
    repo: str = Field(min_length=1)
    commit: str
    patch: str = ""

    @field_validator("commit")
    @classmethod
    def _commit(cls, v: str) -> str:
        if not _HEX40.fullmatch(v):
            raise ValueError("must be a full 40-hex commit id (a branch name is not pinned)")
        return v


class SdistSource(_Model):
    """The sdist ``name==version`` from the package index, checked against ``sha256``
    (the archive's single top-level directory becomes the workspace root)."""

    kind: Literal["sdist"] = "sdist"
    name: str = Field(min_length=1)
    version: str = Field(min_length=1)
    sha256: str
    patch: str = ""

    @field_validator("sha256")
    @classmethod
    def _sha(cls, v: str) -> str:
        if not _HEX64.fullmatch(v):
            raise ValueError("must be 64 lowercase hex digits (the archive's sha256)")
        return v


WorkspaceSource = Annotated[GeneratedSource | GitSource | SdistSource, Field(discriminator="kind")]


class Grader(_Model):
    """``command`` runs in the sandbox with the workspace as cwd; exit 0 means passed.

    ``{python}`` in the command is replaced by the interpreter that
    ``interpreter`` names, resolved by the grader's configuration
    (:class:`rl.tasks.grading.GraderConfig`), never a host path in the file:
    ``system`` is the sandbox's ``/usr/bin/python3`` (unittest only);
    ``project`` is the project's Python (with pytest), made visible read-only.
    ``test_files`` (files or directories) are the task's own tests: restored
    to their starting state before grading.
    """

    command: str = Field(min_length=1)
    test_files: list[str] = Field(min_length=1)
    interpreter: Literal["system", "project"] = "system"
    timeout_s: float = Field(default=60.0, gt=0, le=1800)

    @field_validator("test_files")
    @classmethod
    def _paths(cls, v: list[str]) -> list[str]:
        return [_rel_path(p) for p in v]

    @property
    def agent_command(self) -> str:
        """The command as an agent inside the workspace sandbox would type it: ``{python}`` is
        ``python3`` (the sandbox's ``/usr/bin/python3``). Used by demonstrations; not
        guaranteed to pass for ``interpreter: project`` tasks unless the agent's sandbox sees
        the project's Python (``FLYWHEEL_SANDBOX_EXTRA_RO``) — grading never uses it."""
        return self.command.replace("{python}", "python3")


class Task(_Model):
    id: str
    family: str = Field(min_length=1)
    split: Split
    difficulty: int = Field(ge=1, le=5)
    seed: int
    request: str = Field(min_length=1)
    source: WorkspaceSource
    grader: Grader
    reference_patch: str = Field(min_length=1)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not _ID.fullmatch(v):
            raise ValueError("must be 1-128 characters of letters, digits, '.', '_', '-'")
        return v


def _describe(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "(task)"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{loc}: {err['msg']}{more}"


def task_from_json(obj: Any, *, where: str = "task") -> Task:
    """One task from a parsed JSON value; :class:`TaskFileError` prefixed with ``where``."""
    try:
        return Task.model_validate(obj)
    except ValidationError as exc:
        raise TaskFileError(f"{where}: {_describe(exc)}") from None


def load_tasks(path: str | os.PathLike[str]) -> list[Task]:
    """Every task of a JSONL file (blank lines skipped). Raises :class:`TaskFileError` naming
    ``FILE:LINE: FIELD: problem`` for the first bad line, or a duplicate id."""
    name = Path(path).name
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    try:
        f = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise TaskFileError(f"cannot read task file {path}: {exc.strerror}") from None
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskFileError(f"{name}:{n}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            task = task_from_json(obj, where=f"{name}:{n}")
            if task.id in seen:
                raise TaskFileError(f"{name}:{n}: id: duplicate task id {task.id!r} (first on line {seen[task.id]})")
            seen[task.id] = n
            tasks.append(task)
    return tasks


def write_tasks(path: str | os.PathLike[str], tasks: Iterable[Task]) -> int:
    """Write tasks as JSONL atomically (a temporary file in the same directory, then
    rename): a crash never leaves a half-written set. Returns the count."""
    dest = Path(path)
    tmp = dest.with_name(f".{dest.name}.tmp-{secrets.token_hex(4)}")
    n = 0
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for t in tasks:
                f.write(t.model_dump_json() + "\n")
                n += 1
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return n
