"""SYNTHETIC sessions from a package's code, for tests and demos while no real sessions exist.

One session per documented function: the "user" asks for the docstring's first
sentence and the "agent" reads that function, whose docstring has been removed
from the file (so the answer is not a copy of the query). The events are the
runtime's own event dicts (``agent/events.py``), so they go through the same
extraction (:mod:`agent.trajectories`) as recorded sessions.

Not guaranteed: this is not user data and says nothing about real agent
behaviour; it only exercises the pipeline honestly end to end.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from agent.trajectories import READ_END, READ_PATH, READ_START, READ_TOOL


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
                 "call_id": call, "name": READ_TOOL, "args": {READ_PATH: rel, READ_START: s, READ_END: e}},
                {"type": "tool_result", "seq": 3, "session_id": sid, "turn": 1, "step": 1, "index": 0,
                 "call_id": call, "name": READ_TOOL, "ok": True, "output": shown,
                 "data": {READ_PATH: rel, "total_lines": len(lines), READ_START: s, READ_END: e,
                          "truncated": False}},
            ])
            if max_sessions and len(sessions) >= max_sessions:
                return sessions, texts
    return sessions, texts
