"""The user's files: how a session's workspace meets the editor's project.

A session started by ``flywheel acp`` works, as every Flywheel session does, on
its own workspace: a copy of the editor's project directory made at
``session/new`` (:class:`tools.workspace.WorkspaceStore`), whose starting
snapshot is recorded, so the session replays. Commands run in the sandbox on
that copy. :class:`EditorWorkspace` wraps the copy for the session's tools
(the runtime sees an ordinary :class:`tools.protocols.Workspace`) and ties the
file tools to the project through a :class:`ProjectFiles`:

* **Reads** (``read_file``, and the read inside ``edit_file``) first bring
  the project's current text of that file into the copy: the editor's buffer,
  unsaved changes included, when the client offers ``fs/read_text_file``
  (:class:`EditorFiles`), else the file on disk (:class:`DiskFiles`). The model
  and the commands after it see what the user sees.
* **Writes** (``edit_file``, ``write_file``) go to the project first -- through
  the editor with ``fs/write_text_file`` when the client offers it (the change
  shows up live and can be undone there), else straight to the file on disk --
  then to the copy. If the project's write fails, the copy is not changed and
  the call fails with the reason; if the copy's write fails, the project's old
  text is put back.
* **Concurrent edits**: just before writing, the project's text is read
  again and compared with the copy's (what the model last saw). If the user
  changed the file meanwhile (typed in the buffer, saved, or created it), the
  write is refused with a clear tool error ("changed in the editor ... read it
  again") and nothing is written anywhere. What is guaranteed is that an edit
  never overwrites text the model has not seen, except in the window between
  that last read and the editor applying the write (one round trip; ACP has
  no compare-and-swap write) -- a keystroke in that window is overwritten, and
  the editor's undo brings it back.

* **Commands** run on the copy; the text files they create or change are then
  written to the project the same way, with the same check
  (:mod:`backend.acp.command_sync`).

Not guaranteed: commands see the copy, so a file the model never read or
edited is as it was at ``session/new`` (or at the last read); binary files and
files that are not UTF-8 are read and written in the copy only; text brought into the copy
by a read is not an event (replay re-executes against the recorded starting
snapshot, so a read of a file the user had changed re-executes as "differs").
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Protocol

from tools.base import FileEdit, ToolError
from tools.diffs import is_binary
from tools.paths import PathError

log = logging.getLogger(__name__)

EDITOR_FS_TIMEOUT_S = 10.0
"""How long a file request to the editor may take before it counts as failed."""


class ProjectFilesError(Exception):
    """The project refused or failed a write; the message says why (the model reads it)."""


class ProjectFiles(Protocol):
    """The editor's view of the project's text files. Called from tool threads (blocking)."""

    @property
    def root(self) -> Path: ...

    def read_text(self, rel: str) -> str | None:
        """The current text of ``rel`` (unsaved changes included, if the view has them);
        None when there is no such text file there."""
        ...

    def write_text(self, rel: str, text: str) -> None:
        """Replace (or create) ``rel`` with ``text``; :class:`ProjectFilesError` if refused."""
        ...


def project_path(root: Path, rel: str) -> Path:
    """``root/rel``, refused (:class:`tools.paths.PathError`) if it leads outside ``root``
    (through ``..`` or a symlink the user added after the session started)."""
    base = Path(os.path.realpath(root))
    path = Path(os.path.realpath(base / rel))
    if path != base and not path.is_relative_to(base):
        raise PathError(f"{rel} leads outside the project")
    return base / rel


class DiskFiles:
    """The project's files on disk (for clients that do not offer ``fs/*``)."""

    def __init__(self, root: Path) -> None:
        self._root = Path(root)

    @property
    def root(self) -> Path:
        return self._root

    def read_text(self, rel: str) -> str | None:
        path = project_path(self._root, rel)
        try:
            data = path.read_bytes() if path.is_file() else None
        except OSError:
            return None
        if data is None or is_binary(data):
            return None
        return data.decode("utf-8")

    def write_text(self, rel: str, text: str) -> None:
        path = project_path(self._root, rel)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.flywheel-tmp")
            tmp.write_text(text, encoding="utf-8", newline="")
            if path.exists():
                os.chmod(tmp, path.stat().st_mode & 0o7777)
            os.replace(tmp, path)
        except OSError as exc:
            raise ProjectFilesError(f"cannot write {rel} in the project: {exc.strerror}") from None


class EditorFiles:
    """The project as the editor holds it: ``fs/read_text_file`` and ``fs/write_text_file``
    for what the client offers, the disk (:class:`DiskFiles`) for the rest.

    ``call`` runs a coroutine (an ACP request) on the connection's event loop and
    returns its result; it is called from tool threads. A request that fails or
    takes longer than ``timeout_s``: a read falls back to the disk, a write fails.
    """

    def __init__(self, root: Path, *, read: Callable[[str], Coroutine[Any, Any, str]] | None,
                 write: Callable[[str, str], Coroutine[Any, Any, Any]] | None,
                 loop: asyncio.AbstractEventLoop, timeout_s: float = EDITOR_FS_TIMEOUT_S) -> None:
        self._disk = DiskFiles(root)
        self._read, self._write, self._loop, self.timeout_s = read, write, loop, timeout_s

    @property
    def root(self) -> Path:
        return self._disk.root

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:  # on the loop's own thread a blocking wait would deadlock
            coro.close()
            raise RuntimeError("editor file requests must not be made on the event loop thread")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self.timeout_s)

    def read_text(self, rel: str) -> str | None:
        path = project_path(self.root, rel)
        if self._read is None:
            return self._disk.read_text(rel)
        try:
            return str(self._run(self._read(str(path))))
        except Exception as exc:  # the editor has no such buffer or file, or did not answer
            log.debug("fs/read_text_file %s: %s", path, exc)
            if path.exists():
                return self._disk.read_text(rel)
            return None

    def write_text(self, rel: str, text: str) -> None:
        path = project_path(self.root, rel)
        if self._write is None:
            return self._disk.write_text(rel, text)
        try:  # a new file in a new directory: the editor may not make directories
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ProjectFilesError(f"cannot make the directory of {rel} in the project: {exc.strerror}") from None
        try:
            self._run(self._write(str(path), text))
        except TimeoutError:
            raise ProjectFilesError(f"the editor did not confirm writing {rel} within {self.timeout_s:g} s") from None
        except Exception as exc:
            raise ProjectFilesError(f"the editor refused to write {rel}: {exc}") from None


class EditTextLog:
    """Whole-file (old, new) texts of the writes made through :class:`EditorWorkspace`,
    by path, for the diff content of ``tool_call_update`` (:class:`backend.acp.updates.EditTexts`)."""

    MAX_KEPT = 64  # per path: texts nobody took (a turn that was cut short) do not pile up

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._texts: dict[str, deque[tuple[str | None, str]]] = defaultdict(lambda: deque(maxlen=self.MAX_KEPT))

    def record(self, path: str, old: str | None, new: str) -> None:
        with self._lock:
            self._texts[path].append((old, new))

    def take(self, path: str) -> tuple[str | None, str] | None:
        with self._lock:
            queue = self._texts.get(path)
            return queue.popleft() if queue else None


class EditorWorkspace:
    """A session's workspace whose file tools read from and write to the project
    (module docstring). Everything else is the wrapped workspace's."""

    def __init__(self, inner: Any, files: ProjectFiles, texts: EditTextLog | None = None, *,
                 agreed: dict[str, str] | None = None) -> None:
        self._inner = inner
        self._files = files
        self.texts = texts if texts is not None else EditTextLog()
        self._synced = threading.local()
        # path -> sha256 of the text the project and the copy last agreed on (a read brought it
        # in, a write put it in both); a path not here agrees with the starting snapshot.
        # What a command changed is what differs from this (backend.acp.command_sync).
        self.agreed: dict[str, str] = agreed if agreed is not None else {}

    @property
    def inner(self) -> Any:
        """The session's own workspace (the copy)."""
        return self._inner

    @property
    def files(self) -> ProjectFiles:
        return self._files

    def __getattr__(self, name: str) -> Any:  # root, resolve, exists, snapshot, diff, fork, base...
        return getattr(self._inner, name)

    @property
    def root(self) -> Path:
        return self._inner.root  # type: ignore[no-any-return]

    # -- reads ----------------------------------------------------------------

    def file_size(self, rel: str) -> int:
        self._sync_in(rel)
        self._synced.last = (self._inner.resolve(rel), time.monotonic())
        return self._inner.file_size(rel)  # type: ignore[no-any-return]

    def read_bytes(self, rel: str, *, limit: int | None = None) -> bytes:
        norm = self._inner.resolve(rel)
        last = getattr(self._synced, "last", None)
        if last is None or last[0] != norm or time.monotonic() - last[1] > 1.0:  # file_size just did it
            self._sync_in(rel)
        self._synced.last = None
        return self._inner.read_bytes(rel, limit=limit)  # type: ignore[no-any-return]

    def _sync_in(self, rel: str) -> None:
        """Make the copy hold the project's current text of ``rel`` (text files only)."""
        target = self._target(rel)
        if self._inner.exists(target) and self._inner.is_dir(target):
            return
        current = self._inner.read_bytes(target) if self._inner.exists(target) else None
        if current is not None and is_binary(current):
            return
        text = self._files.read_text(target)
        if text is None:
            return
        data = text.encode("utf-8")
        if data != current:
            self._inner.write_bytes(target, data)
        self.agreed[target] = text_digest(text)

    def _target(self, rel: str) -> str:
        """The path in the project: ``rel`` after the copy's own links (refused if it leaves the tree)."""
        norm = self._inner.resolve(rel)
        try:
            return self._inner.real_path(norm)  # type: ignore[no-any-return]
        except (OSError, PathError):
            return norm  # type: ignore[no-any-return]

    # -- writes ---------------------------------------------------------------

    def write_bytes(self, rel: str, data: bytes) -> FileEdit:
        target = self._target(rel)
        old = self._inner.read_bytes(target) if self._inner.exists(target) else None
        try:
            new_text = data.decode("utf-8")
            old_text = None if old is None else old.decode("utf-8")
        except UnicodeDecodeError:
            return self._inner.write_bytes(rel, data)  # type: ignore[no-any-return]  # binary: the copy only
        if is_binary(data):
            return self._inner.write_bytes(rel, data)  # type: ignore[no-any-return]
        now = self._files.read_text(target)
        if now is not None and now != old_text:
            what = "created" if old_text is None else "changed"
            raise ToolError(f"{target} was {what} in the editor since you last read it; nothing was written. "
                            "read_file it again and redo the edit on its current content")
        # The copy first, then the editor: a copy mounted over the project in place would see the
        # editor's save show through before its own write, and record an empty diff.
        edit: FileEdit = self._inner.write_bytes(rel, data)
        try:
            self._files.write_text(target, new_text)
        except BaseException as exc:
            try:
                if old is None:
                    os.unlink(self._inner.real_path(self._inner.resolve(rel)))
                else:
                    self._inner.write_bytes(rel, old)
            except Exception:
                log.error("could not put %s back in the copy after a failed write to the editor", target)
            if isinstance(exc, ProjectFilesError):
                raise ToolError(f"{exc}; nothing was written") from None
            raise
        self.agreed[target] = text_digest(new_text)
        self.texts.record(edit.path, old_text, new_text)
        return edit


def text_digest(text: str) -> str:
    """The sha256 of ``text`` as UTF-8 (as snapshots hash files)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
