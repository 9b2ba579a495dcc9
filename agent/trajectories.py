"""What a recorded session's agent looked at and changed, and which query it was answering.

A recorded session is the one typed event stream (``agent/events.py``); the
server's log, ``flywheel run --json`` and RL rollouts all hold it. This module
reads it and yields :class:`Evidence`: "for these queries, the agent then
**read** (or **edited**) these lines of this file, and here is the file's text
at that moment". Turning evidence into (query, chunk) training pairs needs a
chunker and is ``embeddings.pairs``' job; this module knows events and tools,
not chunks.

* The queries are the user's request (``user_message``) and the agent's own
  latest search query: a ``semantic_search`` call's query, or a ``grep`` call's
  pattern when it reads as words rather than a regex (:func:`grep_query`).
  A search query covers what is read/edited after it and before the next search
  or user message; the user's request covers everything in its turn.
* Reads are ``read_file`` results (their line range); edits are ``file_edit``
  events (their changed lines, in the new text).

Tool and parameter names come from the tools' specs (``tools/*.py``), so a
renamed tool or parameter fails here at import, not silently later.

File texts: give ``file_text(path)``, the file as it was when the session
started (its source directory or base snapshot); the extractor replays every
``file_edit`` diff on its copy so later line numbers stay right. Without it, a
read of a whole file is reconstructed from the read's own output; otherwise
``Evidence.text`` is None and ``window`` holds what the session showed.

Not guaranteed: a diff that does not apply to the tracked text (the file was
changed behind the runtime's back, e.g. by ``run_command``) makes that file's
text unknown from then on; reads longer than ``max_read_lines`` give no
evidence (a whole-file read is not a specific signal).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agent.events import EVENT_ADAPTER, KNOWN_TYPES, Event
from tools.base import ToolSpec
from tools.grep import Grep
from tools.read_file import ReadFile
from tools.semantic_search import SemanticSearch

FileText = Callable[[str], "str | None"]


def _param(spec: ToolSpec, name: str) -> str:
    if spec.param(name) is None:  # pragma: no cover - a spec change must update this module
        raise ImportError(f"tool {spec.name!r} has no parameter {name!r}; update agent/trajectories.py")
    return name


READ_TOOL = ReadFile.spec.name
READ_PATH, READ_START, READ_END = (_param(ReadFile.spec, p) for p in ("path", "start_line", "end_line"))
SEMANTIC_SEARCH_TOOL = SemanticSearch.spec.name
GREP_TOOL = Grep.spec.name
SEARCH_TOOLS: dict[str, str] = {  # tool name -> the parameter that holds its query
    SEMANTIC_SEARCH_TOOL: _param(SemanticSearch.spec, "query"),
    GREP_TOOL: _param(Grep.spec, "pattern"),
}
_LINE = re.compile(r"^\s*(\d+)\t(.*)$")  # read_file's "<n>\t<text>" lines
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass(frozen=True, slots=True)
class Evidence:
    """Lines of a file the agent read or edited, and the queries they answer."""

    queries: tuple[tuple[str, str], ...]  # (query, kind): kind "user" or the search tool's name
    session_id: str
    evidence: Literal["read", "edit"]
    path: str
    lines: tuple[int, ...]  # 1-based: the lines read, or the changed lines of the new text
    text: str | None  # the whole file at that moment, when known
    window: str  # what the session showed of those lines (read) or the hunks' new side (edit)
    window_start: int
    window_end: int


def grep_query(pattern: str) -> str | None:
    """A grep pattern as a search query, if it reads as words: regex escapes and anchors are
    dropped; patterns that are mostly regex syntax are skipped."""
    p = re.sub(r"\\[bBAZsSdDwW]", " ", pattern)
    p = re.sub(r"\\(.)", r"\1", p)
    p = re.sub(r"[\^$()\[\]{}*+?|]", " ", p)
    p = " ".join(p.split())
    words = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", p)
    if not words or sum(len(w) for w in words) < 3:
        return None
    if len(re.findall(r"[\\\[\]{}*+?|^$]", pattern)) > max(3, len(pattern) // 4):
        return None
    return p


def apply_unified_diff(old: str | None, diff: str) -> str | None:
    """Apply a one-file unified diff (as in ``file_edit``) to ``old``; None if it does not apply."""
    old_lines = (old or "").splitlines(keepends=True)
    out: list[str] = []
    pos = 0  # index into old_lines
    lines = diff.splitlines(keepends=True)
    i = 0
    saw_hunk = False
    while i < len(lines):
        m = _HUNK.match(lines[i])
        if not m:
            i += 1
            continue
        saw_hunk = True
        start = int(m.group(1))
        old_start = start - 1 if (m.group(2) != "0") else start  # ",0" hunks start after that line
        if old_start < pos or old_start > len(old_lines):
            return None
        out += old_lines[pos:old_start]
        pos = old_start
        i += 1
        while i < len(lines) and not lines[i].startswith("@@"):
            ln = lines[i]
            tag, body = ln[:1], ln[1:]
            if ln.startswith("\\"):  # "\ No newline at end of file": strip the previous line's newline
                if out and out[-1].endswith("\n") and i > 0 and lines[i - 1].startswith("+"):
                    out[-1] = out[-1][:-1]
                i += 1
                continue
            if tag == " ":
                if pos >= len(old_lines) or old_lines[pos].rstrip("\r\n") != body.rstrip("\r\n"):
                    return None
                out.append(old_lines[pos])
                pos += 1
            elif tag == "-":
                if pos >= len(old_lines) or old_lines[pos].rstrip("\r\n") != body.rstrip("\r\n"):
                    return None
                pos += 1
            elif tag == "+":
                out.append(body if body.endswith("\n") else body + "\n")
            i += 1
    if not saw_hunk:
        return old
    out += old_lines[pos:]
    return "".join(out)


def changed_new_lines(diff: str) -> tuple[list[int], list[str]]:
    """1-based line numbers (in the new text) of added lines, or the position of pure deletions;
    and the hunks' new-side text lines (context + added) for the window fallback."""
    nums: list[int] = []
    new_side: list[str] = []
    new_no = 0
    for ln in diff.splitlines():
        m = _HUNK.match(ln)
        if m:
            new_no = int(m.group(3))
            continue
        if not new_no and not nums and not ln.startswith((" ", "+", "-")):
            continue
        if ln.startswith("+++") or ln.startswith("---"):
            continue
        if ln.startswith("+"):
            nums.append(new_no)
            new_side.append(ln[1:])
            new_no += 1
        elif ln.startswith(" "):
            new_side.append(ln[1:])
            new_no += 1
        elif ln.startswith("-"):
            nums.append(max(1, new_no))
    return sorted(set(nums)), new_side


class _Files:
    """The extractor's view of the workspace's files during the session."""

    def __init__(self, file_text: FileText | None):
        self.file_text = file_text
        self.texts: dict[str, str | None] = {}
        self.seen_lines: dict[str, dict[int, str]] = {}

    def text(self, path: str) -> str | None:
        if path not in self.texts:
            self.texts[path] = self.file_text(path) if self.file_text else None
        return self.texts[path]

    def edit(self, path: str, diff: str, *, created: bool, deleted: bool) -> None:
        if deleted:
            self.texts[path] = None
            return
        old = "" if created else self.text(path)
        self.texts[path] = apply_unified_diff(old, diff) if (old is not None) else None
        self.seen_lines.pop(path, None)

    def saw(self, path: str, lines: dict[int, str], total: int | None) -> None:
        known = self.seen_lines.setdefault(path, {})
        known.update(lines)
        if self.texts.get(path) is None and total and len(known) >= total and all(n in known for n in range(1, total + 1)):
            self.texts[path] = "".join(known[n] + "\n" for n in range(1, total + 1))


def _coerce(events: Iterable[Event | dict[str, Any]]) -> Iterator[Event]:
    for e in events:
        if isinstance(e, dict):
            if e.get("type") not in KNOWN_TYPES:
                continue
            e = EVENT_ADAPTER.validate_python(e)
        yield e


def evidence_from_events(events: Iterable[Event | dict[str, Any]], *, file_text: FileText | None = None,
                         max_read_lines: int = 200) -> Iterator[Evidence]:
    """Evidence from one session's events (event models or their JSON dicts), in order.
    Dicts of event types this version does not know are skipped."""
    files = _Files(file_text)
    calls: dict[str, tuple[str | None, dict[str, Any]]] = {}
    user_q: str | None = None
    search_q: tuple[str, str] | None = None  # (query, tool)
    session_id = ""

    def queries() -> tuple[tuple[str, str], ...]:
        return tuple(q for q in ((user_q, "user") if user_q else None, search_q) if q is not None)

    for e in _coerce(events):
        session_id = session_id or e.session_id
        if e.type == "user_message":
            user_q = " ".join(e.text.split()) or None
            search_q = None
        elif e.type == "tool_call_started":
            calls[e.call_id] = (e.name, dict(e.args))
            if e.name in SEARCH_TOOLS and e.valid:
                raw = str(e.args.get(SEARCH_TOOLS[e.name], "") or "")
                q = raw.strip() if e.name == SEMANTIC_SEARCH_TOOL else grep_query(raw)
                search_q = (" ".join(q.split()), e.name) if q and q.strip() else None
        elif e.type == "tool_result":
            name, args = calls.get(e.call_id, (e.name, {}))
            if name != READ_TOOL or not e.ok:
                continue
            data = e.data or {}
            path = str(data.get(READ_PATH) or args.get(READ_PATH) or "").removeprefix("./")
            if not path or data.get("binary"):
                continue
            shown: dict[int, str] = {}
            for ln in e.output.splitlines():
                m = _LINE.match(ln)
                if m:
                    shown[int(m.group(1))] = m.group(2)
            start = int(data.get(READ_START) or args.get(READ_START) or (min(shown) if shown else 1))
            end = int(data.get(READ_END) or args.get(READ_END) or (max(shown) if shown else start))
            files.saw(path, shown, data.get("total_lines"))
            if end - start + 1 > max_read_lines:
                continue
            window = "\n".join(shown[n] for n in sorted(shown) if start <= n <= end)
            yield Evidence(queries(), session_id, "read", path, tuple(range(start, end + 1)), files.text(path),
                           window, start, end)
        elif e.type == "file_edit":
            path = e.path.removeprefix("./")
            files.edit(path, e.diff, created=e.created, deleted=e.deleted)
            if e.deleted:
                continue
            nums, new_side = changed_new_lines(e.diff)
            if not nums:
                continue
            yield Evidence(queries(), session_id, "edit", path, tuple(nums), files.text(path),
                           "\n".join(new_side), min(nums), max(nums))


# -- sources of sessions ----------------------------------------------------------------------------


def read_events_jsonl(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """A JSONL file of events (any sessions, as ``flywheel run --json`` prints them), grouped by
    ``session_id`` in file order. Lines that are not JSON objects with a ``type`` are skipped."""
    by: dict[str, list[dict[str, Any]]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(d, dict) and "type" in d:
                by.setdefault(str(d.get("session_id", "")), []).append(d)
    return by


def dir_file_text(root: str | Path) -> FileText:
    """``file_text`` for a session that started from the directory ``root``: files beneath it,
    as UTF-8 (None for anything else, or for a path that resolves outside ``root``)."""
    base = Path(root).resolve()

    def read(path: str) -> str | None:
        p = (base / path).resolve()
        if not p.is_relative_to(base) or not p.is_file():
            return None
        try:
            return p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    return read


def session_repo(source: dict[str, Any] | None, fallback: str) -> str:
    """A repository key from a session's ``source`` ({"kind": "dir"|"git", "path": ...})."""
    if source and source.get("path"):
        return str(source["path"]).rstrip("/")
    return fallback


def source_file_text(source: dict[str, Any] | None) -> FileText | None:
    """``file_text`` from a session's ``source`` when it is a directory that still exists."""
    if source and source.get("kind") == "dir" and source.get("path") and Path(source["path"]).is_dir():
        return dir_file_text(source["path"])
    return None
