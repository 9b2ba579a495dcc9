"""(query, chunk) training pairs from recorded sessions.

A recorded session is the one typed event stream (``agent/events.py``). A pair
says "for this query, this chunk was what the agent needed":

* the query is the user's request (``user_message``) or the agent's own search
  query (a ``semantic_search`` call's ``query``, or a ``grep`` call's
  ``pattern`` when it reads as words rather than a regex);
* the chunk is one the agent then **read** (a ``read_file`` result's line range
  → the chunks overlapping it) or **edited** (a ``file_edit``'s changed lines →
  the chunks of the new text overlapping them).

A search query is paired with what was read/edited after it and before the next
search or user message; the user's request with everything in its turn.

To chunk, the extractor needs the file's text *at the time of the event*. Give
``file_text(path)``: the file as it was when the session started (its source
directory, or its base snapshot); the extractor then replays every
``file_edit`` diff on its copy, so later line numbers stay right. Without it,
a read of a whole file is reconstructed from the read's own output, and
otherwise the read lines (or an edit hunk's new side) become a ``window`` chunk.

Reads that touch more than ``max_chunks`` chunks (e.g. a whole file) are not a
specific signal and give no pairs; nor do edits touching more.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from embeddings.types import Chunk

FileText = Callable[[str], "str | None"]
Chunker = Callable[[str, str], list[Chunk]]

READ_TOOLS = {"read_file"}
SEARCH_TOOLS = {"semantic_search": "query", "grep": "pattern"}
_LINE = re.compile(r"^\s*(\d+)\t(.*)$")
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass(frozen=True, slots=True)
class Pair:
    query: str
    chunk: Chunk
    repo: str  # what held-out evaluation splits on (a repository or source)
    session_id: str = ""
    query_kind: str = "user"  # "user" | "semantic_search" | "grep"
    evidence: str = "read"  # "read" | "edit"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["chunk"] = asdict(self.chunk)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Pair:
        return cls(**{**d, "chunk": Chunk(**d["chunk"])})


def default_chunker(path: str, text: str) -> list[Chunk]:
    from embeddings.chunking import chunk_file

    return chunk_file(path, text.encode("utf-8", "surrogatepass"))


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

    def __init__(self, file_text: FileText | None, chunker: Chunker):
        self.file_text, self.chunker = file_text, chunker
        self.texts: dict[str, str | None] = {}
        self.seen_lines: dict[str, dict[int, str]] = {}
        self._chunks: dict[tuple[str, int], list[Chunk]] = {}

    def text(self, path: str) -> str | None:
        if path not in self.texts:
            self.texts[path] = self.file_text(path) if self.file_text else None
        return self.texts[path]

    def chunks(self, path: str) -> list[Chunk] | None:
        text = self.text(path)
        if text is None:
            return None
        key = (path, hash(text))
        if key not in self._chunks:
            try:
                self._chunks[key] = self.chunker(path, text)
            except Exception:  # noqa: BLE001 - a file the chunker cannot handle gives no pairs
                self._chunks[key] = []
        return self._chunks[key]

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


def _overlapping(chunks: list[Chunk], lines: Iterable[int]) -> list[Chunk]:
    """Chunks overlapping the lines, the most specific only: a chunk that encloses another
    overlapping chunk (a class summary around the method that was read) is dropped."""
    ls = list(lines)
    hit = [c for c in chunks if any(c.start_line <= n <= c.end_line for n in ls)]
    return [c for c in hit if not any(
        o is not c and c.start_line <= o.start_line and o.end_line <= c.end_line
        and (o.start_line, o.end_line) != (c.start_line, c.end_line) for o in hit)]


def _coerce(events: Iterable[Any]) -> Iterator[Any]:
    from agent.events import EVENT_ADAPTER, KNOWN_TYPES

    for e in events:
        if isinstance(e, dict):
            if e.get("type") not in KNOWN_TYPES:
                continue
            e = EVENT_ADAPTER.validate_python(e)
        yield e


def pairs_from_events(events: Iterable[Any], *, repo: str = "", file_text: FileText | None = None,
                      chunker: Chunker | None = None, max_chunks: int = 3, max_read_lines: int = 200,
                      ) -> list[Pair]:
    """Pairs from one session's events (event models or their JSON dicts), in order."""
    files = _Files(file_text, chunker or default_chunker)
    calls: dict[str, tuple[str | None, dict[str, Any]]] = {}
    user_q: str | None = None
    search_q: tuple[str, str] | None = None  # (query, tool)
    session_id = ""
    out: list[Pair] = []
    seen: set[tuple[str, str]] = set()

    def emit(chunks: list[Chunk], evidence: str) -> None:
        if not chunks or len(chunks) > max_chunks:
            return
        queries = []
        if user_q:
            queries.append((user_q, "user"))
        if search_q:
            queries.append(search_q)
        for q, kind in queries:
            for c in chunks:
                key = (q, c.content_hash)
                if key in seen or not c.text.strip():
                    continue
                seen.add(key)
                out.append(Pair(q, c, repo, session_id, kind, evidence))

    for e in _coerce(events):
        session_id = session_id or e.session_id
        t = e.type
        if t == "user_message":
            user_q = " ".join(e.text.split()) or None
            search_q = None
        elif t == "tool_call_started":
            calls[e.call_id] = (e.name, dict(e.args))
            if e.name in SEARCH_TOOLS and e.valid:
                raw = str(e.args.get(SEARCH_TOOLS[e.name], "") or "")
                q = raw.strip() if e.name == "semantic_search" else grep_query(raw)
                search_q = (" ".join(q.split()), e.name) if q and q.strip() else None
        elif t == "tool_result":
            name, args = calls.get(e.call_id, (e.name, {}))
            if name not in READ_TOOLS or not e.ok:
                continue
            data = e.data or {}
            path = str(data.get("path") or args.get("path") or "").removeprefix("./")
            if not path or data.get("binary"):
                continue
            shown: dict[int, str] = {}
            for ln in e.output.splitlines():
                m = _LINE.match(ln)
                if m:
                    shown[int(m.group(1))] = m.group(2)
            start = int(data.get("start_line") or args.get("start_line") or (min(shown) if shown else 1))
            end = int(data.get("end_line") or args.get("end_line") or (max(shown) if shown else start))
            files.saw(path, shown, data.get("total_lines"))
            if end - start + 1 > max_read_lines:
                continue
            chunks = files.chunks(path)
            if chunks is not None:
                emit(_overlapping(chunks, range(start, end + 1)), "read")
            elif shown:
                body = "\n".join(shown[n] for n in sorted(shown) if start <= n <= end)
                emit([Chunk(path, start, end, "window", "", "text", body)], "read")
        elif t == "file_edit":
            path = e.path.removeprefix("./")
            files.edit(path, e.diff, created=e.created, deleted=e.deleted)
            if e.deleted:
                continue
            nums, new_side = changed_new_lines(e.diff)
            chunks = files.chunks(path)
            if chunks is not None:
                emit(_overlapping(chunks, nums), "edit")
            elif nums and new_side:
                emit([Chunk(path, min(nums), max(nums), "window", "", "text", "\n".join(new_side))], "edit")
    return out


# -- sources of sessions ----------------------------------------------------------------------------


def read_events_jsonl(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """A JSONL file of events (any sessions, as ``flywheel run --json`` prints them), grouped by
    ``session_id`` in file order. Lines that are not events are skipped."""
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
    base = Path(root)

    def read(path: str) -> str | None:
        p = (base / path).resolve()
        if not p.is_relative_to(base.resolve()) or not p.is_file():
            return None
        try:
            return p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    return read


def pairs_from_jsonl(path: str | Path, *, workspace_root: str | Path | None = None, repo: str | None = None,
                     **kw: Any) -> list[Pair]:
    """Pairs from a JSONL of events. ``repo`` defaults to each session's id (so a held-out split
    keeps sessions apart); ``workspace_root`` is the sessions' starting tree, if known."""
    ft = dir_file_text(workspace_root) if workspace_root else None
    out: list[Pair] = []
    for sid, evs in read_events_jsonl(path).items():
        out += pairs_from_events(evs, repo=repo or sid or "events", file_text=ft, **kw)
    return out


def session_repo(source: dict[str, Any] | None, fallback: str) -> str:
    """A repository key from a session's ``source`` ({"kind": "dir"|"git", "path": ...})."""
    if source and source.get("path"):
        return str(source["path"]).rstrip("/")
    return fallback


def pairs_from_log(log: Any, *, limit: int = 10_000, **kw: Any) -> list[Pair]:
    """Pairs from every session in a :class:`backend.db.log.SessionLog` (newest first). The
    session's source directory, when it still exists, gives the starting file texts."""
    out: list[Pair] = []
    offset = 0
    while offset < limit:
        page = log.list_sessions(limit=min(500, limit - offset), offset=offset)
        if not page:
            break
        offset += len(page)
        for info in page:
            src = info.source or {}
            ft = None
            if src.get("kind") == "dir" and src.get("path") and Path(src["path"]).is_dir():
                ft = dir_file_text(src["path"])
            out += pairs_from_events(log.all_events(info.id), repo=session_repo(src, info.id), file_text=ft, **kw)
    return out


def write_pairs(pairs: Iterable[Pair], path: str | Path) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for p in pairs:
            f.write(json.dumps(p.to_json()) + "\n")
            n += 1
    return n


def read_pairs(path: str | Path) -> list[Pair]:
    with open(path, encoding="utf-8") as f:
        return [Pair.from_json(json.loads(line)) for line in f if line.strip()]


# -- a synthetic trajectory set (until real sessions are recorded) ------------------------------------


def _first_sentence(doc: str) -> str:
    para = " ".join(re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0].split())
    m = re.search(r"(.+?[.!?])(\s|$)", para)
    return (m.group(1) if m else para)[:300]


def _strip_function_docstrings(source: str) -> tuple[str, list[tuple[str, str]]]:
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    cut: list[tuple[int, int, str | None]] = []
    docs: list[tuple[str, str]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(ch)
                b = ch.body[0]
                if doc and b.lineno != ch.lineno and b.end_lineno:
                    docs.append((prefix + ch.name, doc))
                    ind = re.match(r"\s*", lines[b.lineno - 1]).group(0)
                    cut.append((b.lineno, b.end_lineno, f"{ind}pass\n" if len(ch.body) == 1 else None))
                walk(ch, prefix + ch.name + ".")
            elif isinstance(ch, ast.ClassDef):
                walk(ch, prefix + ch.name + ".")

    walk(tree, "")
    for a, b, r in sorted(cut, reverse=True):
        lines[a - 1:b] = [r] if r else []
    return "".join(lines), docs


def synthetic_sessions(package_dir: str | Path, *, repo: str | None = None, max_sessions: int | None = None,
                       ) -> tuple[list[list[dict[str, Any]]], dict[str, str]]:
    """SYNTHETIC trajectories from a package's code, for tests and demos while no real sessions
    exist: one session per documented function, where the "user" asks for the docstring's first
    sentence and the "agent" reads that function (docstrings are removed from the files, so the
    answer is not a copy of the query). Returns (event dicts per session, {path: stripped text})
    — pass ``texts.get`` as ``file_text``. This is not user data and says nothing about real
    agent behaviour; it only exercises the pipeline honestly end to end."""
    base = Path(package_dir)
    name = repo or base.name
    texts: dict[str, str] = {}
    sessions: list[list[dict[str, Any]]] = []
    for f in sorted(base.rglob("*.py")):
        rel_parts = f.relative_to(base).parts
        if any(p in ("tests", "test", "__pycache__") for p in rel_parts):
            continue
        rel = f"{name}/" + "/".join(rel_parts)
        try:
            stripped, docs = _strip_function_docstrings(f.read_text(encoding="utf-8"))
            tree = ast.parse(stripped)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        texts[rel] = stripped
        spans: dict[str, tuple[int, int]] = {}

        def walk(node: ast.AST, prefix: str) -> None:
            for ch in ast.iter_child_nodes(node):
                if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    spans.setdefault(prefix + ch.name, (ch.lineno, ch.end_lineno or ch.lineno))
                    walk(ch, prefix + ch.name + ".")
                elif isinstance(ch, ast.ClassDef):
                    walk(ch, prefix + ch.name + ".")

        walk(tree, "")
        lines = stripped.splitlines()
        for qual, doc in docs:
            q = _first_sentence(doc)
            if qual not in spans or len(q.split()) < 3:
                continue
            s, e = spans[qual]
            sid = f"synthetic-{name}-{len(sessions)}"
            call = f"c{len(sessions)}"
            shown = "".join(f"{n:>5}\t{lines[n - 1]}\n" for n in range(s, e + 1))
            sessions.append([
                {"type": "user_message", "seq": 1, "session_id": sid, "turn": 1, "text": q},
                {"type": "tool_call_started", "seq": 2, "session_id": sid, "turn": 1, "step": 1, "index": 0,
                 "call_id": call, "name": "read_file", "args": {"path": rel, "start_line": s, "end_line": e}},
                {"type": "tool_result", "seq": 3, "session_id": sid, "turn": 1, "step": 1, "index": 0,
                 "call_id": call, "name": "read_file", "ok": True, "output": shown,
                 "data": {"path": rel, "total_lines": len(lines), "start_line": s, "end_line": e,
                          "truncated": False}},
            ])
            if max_sessions and len(sessions) >= max_sessions:
                return sessions, texts
    return sessions, texts


def synthetic_pairs(package_dir: str | Path, *, repo: str | None = None, max_sessions: int | None = None,
                    **kw: Any) -> list[Pair]:
    """Pairs from :func:`synthetic_sessions` (SYNTHETIC; see there)."""
    name = repo or Path(package_dir).name
    sessions, texts = synthetic_sessions(package_dir, repo=name, max_sessions=max_sessions)
    out: list[Pair] = []
    for evs in sessions:
        out += pairs_from_events(evs, repo=name, file_text=texts.get, **kw)
    return out
