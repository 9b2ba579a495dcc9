"""Files a command changed in the session's copy, written back to the editor's project.

A command runs in the sandbox on the session's copy of the project
(:mod:`backend.acp.fs_bridge`). When it finishes -- before its result is
returned, so before the model's next call reads anything -- the text files it
created or changed are written to the project the way edits are: through the
editor with ``fs/write_text_file`` when the client offers it (they show up live
and can be undone there), else to the file on disk. The editor then sees them
as ``diff`` content on the command's ``tool_call_update``, with a notice of
what was written and what was not.

What counts as changed by the command (:meth:`CommandSync.after_command`): the
copy's files whose stat (size, mtime, ctime -- which no command can set back --,
inode, mode) changed since the look taken
before the session's first command or after the last one (the files
``.gitignore`` hides, as ``flywheel sessions diff`` does not show them either,
are not looked at; before any look: ``Workspace.changed_paths``, what differs
from the starting snapshot) *and* whose text differs from the text the project and
the copy last agreed on (:attr:`EditorWorkspace.agreed`: set by every read that
brought the project's text in and every edit that wrote both). A file is
written only if the project still holds that agreed text -- the user has not
changed it since -- checked again just before the write; otherwise it is left
in the copy with a notice, as an edit in that case is refused. In a session
opened again (``session/load``) what the copy holds before its first command
there counts as agreed (:meth:`CommandSync.before_command`): an older change is
never written over what the user has done since.

Permission: in the ``ask`` mode the editor is asked before the files are
written (``session/request_permission`` on a call of its own,
``<command's call id>.write-back``, kind ``edit``, shown as completed or failed
by the answer; *Always allow* covers every later command of the session); in ``agent`` and
``auto`` they are written, as edits are. A refusal leaves them in the copy.

Left in the copy, each named once in a notice: binary and non-UTF-8 files,
files over :data:`MAX_WRITE_BACK_BYTES`, symlinks, files past the first
:data:`MAX_WRITE_BACK_FILES` of one command, deleted files (ACP cannot delete a
file; it stays in the project), and files the editor refused to write.

Not guaranteed: finding the changes stats the copy's shown files after every
command (``benchmarks/acp_write_back.py``); on a file system whose clock ticks
slower than :data:`RACY_NS` (files changed that close before a look are read
again at the next one), a change in the same tick as the look can be missed
until the file changes again; a command that was cancelled is
not followed by a write-back (its changes are found after the next command);
what is written is not an event (replay re-executes against
the copy); a file the model reads while the copy's version was left out gets
the project's text again (the project is what the user sees).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import stat
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.approval import ApprovalDecision
from backend.acp.fs_bridge import EditorWorkspace, ProjectFilesError, text_digest
from tools.base import complete_in_thread
from tools.diffs import ChangeKind, is_binary
from tools.paths import PathError, display_path
from tools.sandbox import CommandResult, Sandbox, SandboxLimits
from tools.snapshots import EntryKind
from tools.treewalk import scan_tree

log = logging.getLogger(__name__)

MAX_WRITE_BACK_BYTES = 1 << 20
"""The largest file a command changed that is written back to the editor."""
MAX_WRITE_BACK_FILES = 64
"""The most files of one command written back; the rest stay in the copy (with a notice)."""

RACY_NS = 50_000_000
"""A file modified this close before a look is checked again at the next one (a change in
the same tick of the file system's clock leaves its stat as it was)."""

Approve = Callable[[str | None, list[str]], Awaitable[ApprovalDecision]]
"""Asked before writing back (the command's call id, the paths); the mode decides."""


@dataclass(frozen=True, slots=True)
class Written:
    path: str
    old: str | None
    new: str


@dataclass(slots=True)
class CommandReport:
    """What one command's write-back did: files ``written`` (with their old and new
    text, for diffs) and ``left`` in the copy (path, why)."""

    written: list[Written] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)

    def notice(self) -> str:
        """One or two lines for the editor; empty when there is nothing to say."""
        lines = []
        if self.written:
            lines.append("Written to the editor: " + ", ".join(w.path for w in self.written))
        if self.left:
            lines.append("Left in the session's copy, not written to the editor: "
                         + "; ".join(f"{p} ({why})" for p, why in self.left))
        return "\n".join(lines)


class CommandReports:
    """Reports by the command's call id, until the command's result is shown (thread-safe)."""

    MAX_KEPT = 64

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reports: dict[str | None, CommandReport] = {}

    def put(self, call_id: str | None, report: CommandReport) -> None:
        with self._lock:
            if len(self._reports) >= self.MAX_KEPT:  # results nobody showed (a cut turn)
                self._reports.pop(next(iter(self._reports)))
            self._reports[call_id] = report

    def take(self, call_id: str) -> CommandReport | None:
        with self._lock:
            return self._reports.pop(call_id, None) or self._reports.pop(None, None)


@dataclass(frozen=True, slots=True)
class _Look:
    entries: dict[str, tuple[int, int, int, int, int]]  # path -> (mode, size, mtime_ns, ctime_ns, inode)
    taken_ns: int


@dataclass(frozen=True, slots=True)
class _Pending:
    path: str
    expect: str | None  # the project's text now (None: no such file)
    new: str
    digest: str


class CommandSync:
    """Writes back what commands change in one session's copy (module docstring)."""

    def __init__(self, workspace: EditorWorkspace, *, approve: Approve | None = None,
                 reports: CommandReports | None = None, baseline: bool = False) -> None:
        self.workspace = workspace
        self.approve = approve
        self.reports = reports if reports is not None else CommandReports()
        self._noticed: dict[str, str] = {}  # path -> the state last named in a notice
        self._lock = asyncio.Lock()
        self._baseline = baseline
        self._seen: _Look | None = None  # the copy's files' stat at the last look

    async def before_command(self) -> None:
        """Before the session's first command: look at the copy (what changes from here on
        is found by its files' stat, not by hashing the tree). With ``baseline`` (a session
        opened again, whose copy holds what earlier commands and edits left), also take what
        the copy holds now as agreed with the project, so only what commands change from
        here on is written back -- never an old change over what the user has done since."""
        if self._seen is not None and not self._baseline:
            return
        async with self._lock:  # a command started meanwhile waits here too, before it runs
            try:
                if self._baseline:
                    self._baseline = False
                    await asyncio.to_thread(self._take_baseline)
                if self._seen is None:
                    self._seen = await asyncio.to_thread(self._look)
            except Exception as exc:  # the command still runs; its changes are found after it
                log.warning("reading the session's copy before a command failed: %s", exc)

    async def after_command(self, call_id: str | None = None) -> CommandReport:
        """Find what the copy has that the project lacks, write it back, keep the report
        for ``call_id``'s result. Never raises for a file's or the editor's fault."""
        async with self._lock:
            report = CommandReport()
            try:
                pending = await asyncio.to_thread(self._plan, report)
                if pending and self.approve is not None:
                    decision = await self.approve(call_id, [p.path for p in pending])
                    if not decision.approved:
                        why = decision.reason.strip("() ") or "the user declined"
                        report.left += [(p.path, f"not written: {why}") for p in pending]
                        pending = []
                if pending:
                    await complete_in_thread(self._write, pending, report)
            except Exception as exc:  # the workspace is gone, the editor went away...
                log.warning("writing back a command's changes failed: %s", exc)
                report.left.append(("(all files)", f"writing back failed: {exc}"))
            if report.written or report.left:
                self.reports.put(call_id, report)
            return report

    # -- blocking parts (worker threads) -----------------------------------------

    def _agreed(self, path: str, base: Mapping[str, Any]) -> tuple[bool, str | None]:
        """(known, digest): the text the project and the copy last agreed on (None: no file)."""
        if path in self.workspace.agreed:
            return True, self.workspace.agreed[path]
        entry = base.get(path)
        if entry is None:
            return True, None
        if entry.kind is not EntryKind.FILE or entry.sha256 is None:
            return False, None
        return True, str(entry.sha256)

    def _take_baseline(self) -> None:
        copy = self.workspace.inner
        for change in copy.changed_paths():
            path = change.path
            if change.kind is ChangeKind.DELETED:
                self._noticed[path] = "deleted"
                continue
            if path in self.workspace.agreed:
                continue
            try:
                data = copy.read_bytes(path, limit=MAX_WRITE_BACK_BYTES + 1)
            except (OSError, PathError):
                continue
            if len(data) > MAX_WRITE_BACK_BYTES:
                self._noticed[path] = f"big:{copy.file_size(path)}"
            else:
                self.workspace.agreed[path] = hashlib.sha256(data).hexdigest()

    def _once(self, report: CommandReport, path: str, state: str, why: str) -> None:
        if self._noticed.get(path) != state:
            self._noticed[path] = state
            report.left.append((path, why))

    def _look(self) -> _Look:
        """The stat of every file and link the copy shows (what ``.gitignore`` hides is left out)."""
        copy = self.workspace.inner
        rules = copy.ignore_rules()
        taken_ns = time.time_ns()
        entries: dict[str, tuple[int, int, int, int, int]] = {}
        for item in scan_tree(copy.root, on_limit=lambda item, exc: None,
                              include=lambda item: rules.shown(item.path, is_dir=stat.S_ISDIR(item.st.st_mode))):
            st = item.st
            if not stat.S_ISDIR(st.st_mode):
                entries[display_path(item.path)] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        return _Look(entries, taken_ns)

    def _changes(self) -> list[tuple[str, bool]]:
        """(path, deleted) for what may have changed since the last look: the paths whose stat
        differs, and those modified so close to the last look that a change in the same clock
        tick would not show (as git's "racy" entries). Before any look: what differs from the
        starting snapshot (``changed_paths``). Takes the next look first, so a change made
        meanwhile (a command of the same step still running) is found next time."""
        last, self._seen = self._seen, self._look()
        if last is None:
            return [(c.path, c.kind is ChangeKind.DELETED) for c in self.workspace.inner.changed_paths()]
        now = self._seen.entries
        racy = last.taken_ns - RACY_NS
        out = [(p, False) for p, st in now.items() if last.entries.get(p) != st or st[3] >= racy]
        return out + [(p, True) for p in last.entries if p not in now]

    def _plan(self, report: CommandReport) -> list[_Pending]:
        copy = self.workspace.inner
        files = self.workspace.files
        base = copy.base.manifest
        pending: list[_Pending] = []
        for path, deleted in self._changes():
            known, agreed = self._agreed(path, base)
            if deleted:
                if agreed is not None:
                    self._once(report, path, "deleted", "deleted in the copy; ACP cannot delete files, "
                                                       "so it is still in the project")
                continue
            try:
                st = os.lstat(Path(copy.root) / path)
                if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
                    self._once(report, path, "link", "a symlink or special file")
                    continue
                if st.st_size > MAX_WRITE_BACK_BYTES:
                    self._once(report, path, f"big:{st.st_size}", f"over {MAX_WRITE_BACK_BYTES >> 20} MiB")
                    continue
                data = copy.read_bytes(path, limit=MAX_WRITE_BACK_BYTES + 1)
            except (OSError, PathError):
                continue  # removed meanwhile, or not readable as a file
            digest = hashlib.sha256(data).hexdigest()
            if known and digest == agreed:
                continue  # the project already had this text (or the user changed it since: theirs)
            try:
                text = None if is_binary(data) else data.decode("utf-8")
            except UnicodeDecodeError:
                text = None
            if text is None:
                self._once(report, path, digest, "binary or not UTF-8")
                continue
            try:
                now = files.read_text(path)
            except PathError as exc:
                self._once(report, path, digest, str(exc))
                continue
            if now == text:
                self.workspace.agreed[path] = digest
                continue
            if not known:
                self._once(report, path, digest, "its starting state is not known (too large, or not a "
                                                 "file), so an edit in the editor cannot be ruled out")
                continue
            if (None if now is None else text_digest(now)) != agreed:
                self._once(report, path, digest, "changed in the editor meanwhile")
                continue
            if len(pending) >= MAX_WRITE_BACK_FILES:
                self._once(report, path, digest, f"more than {MAX_WRITE_BACK_FILES} files changed")
                continue
            pending.append(_Pending(path, now, text, digest))
        return pending

    def _write(self, pending: list[_Pending], report: CommandReport) -> None:
        files = self.workspace.files
        for p in pending:
            try:
                if files.read_text(p.path) != p.expect:
                    self._once(report, p.path, p.digest, "changed in the editor meanwhile")
                    continue
                files.write_text(p.path, p.new)
            except (ProjectFilesError, PathError) as exc:
                self._once(report, p.path, p.digest, str(exc))
                continue
            self.workspace.agreed[p.path] = p.digest
            self._noticed.pop(p.path, None)
            report.written.append(Written(p.path, p.expect, p.new))


def current_call_id() -> str | None:
    """The tool call this code runs for: the executor runs each call in a task named
    ``tool:<call_id>`` (:mod:`agent.executor`); None elsewhere."""
    task = asyncio.current_task()
    name = task.get_name() if task is not None else ""
    return name.removeprefix("tool:") if name.startswith("tool:") else None


class WriteBackSandbox:
    """A :class:`tools.sandbox.Sandbox` that, once a command run in a session's copy has
    finished, writes back what it changed (``syncs``: by the copy's root). A command
    in any other tree (a replay's) runs as the wrapped sandbox runs it."""

    def __init__(self, inner: Sandbox, syncs: Mapping[str, CommandSync]) -> None:
        self.inner = inner
        self.syncs = syncs

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def run(self, command: str, cwd: Path, limits: SandboxLimits | None = None, *,
                  on_output: Callable[[bytes], None] | None = None) -> CommandResult:
        sync = self.syncs.get(str(cwd))
        if sync is not None:
            await sync.before_command()
        if on_output is None:
            result = await self.inner.run(command, cwd, limits)
        else:
            result = await self.inner.run(command, cwd, limits, on_output=on_output)
        if sync is not None:
            await sync.after_command(current_call_id())
        return result
