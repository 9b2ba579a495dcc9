"""Reading recorded event streams: what the agent read or edited, for which query.

Most checks look at the pairs the whole chain makes (agent.trajectories -> embeddings.pairs, joined
by backend.embeddings_train as `flywheel embeddings train` does), because that is what the events mean
for training; a few look at the Evidence itself."""

from __future__ import annotations

import json
from pathlib import Path

from agent.events import FileEditEvent, ToolCallStarted, ToolResultEvent, UserMessage
from agent.trajectories import SEARCH_TOOLS, Evidence, apply_unified_diff, evidence_from_events, grep_query
from backend.embeddings_train import pairs_from_events, pairs_from_jsonl, synthetic_pairs
from embeddings.pairs import Pair, read_pairs, write_pairs
from embeddings.types import Chunk
from tools.grep import Grep
from tools.read_file import ReadFile
from tools.semantic_search import SemanticSearch
from tools.diffs import unified_diff  # noqa: F401  (imported to make sure our diffs are the runtime's)

SRC = '''import os


def parse_port(value):
    n = int(value)
    if n < 0 or n > 65535:
        raise ValueError(value)
    return n


def join_url(host, port):
    return f"http://{host}:{port}"


class Config:
    def load(self, path):
        with open(path) as f:
            return f.read()

    def save(self, path, text):
        with open(path, "w") as f:
            f.write(text)
'''


def line_chunker(path: str, text: str) -> list[Chunk]:
    """A tiny deterministic chunker for the tests: one chunk per top-level def/class member."""
    import ast

    tree = ast.parse(text)
    lines = text.splitlines()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            out.append(Chunk(path, node.lineno, node.end_lineno, "function", node.name, "python",
                             "\n".join(lines[node.lineno - 1:node.end_lineno])))
    return sorted(out, key=lambda c: c.start_line)


def render(text: str, start: int, end: int) -> str:
    lines = text.splitlines()
    return "".join(f"{n:>5}\t{lines[n - 1]}\n" for n in range(start, end + 1))


def read_events(sid: str, call: str, path: str, text: str, start: int, end: int, seq: int) -> list:
    return [
        ToolCallStarted(seq=seq, session_id=sid, step=1, index=0, call_id=call, name="read_file",
                        args={"path": path, "start_line": start, "end_line": end}),
        ToolResultEvent(seq=seq + 1, session_id=sid, step=1, index=0, call_id=call, name="read_file", ok=True,
                        output=render(text, start, end),
                        data={"path": path, "total_lines": len(text.splitlines()), "start_line": start,
                              "end_line": end, "truncated": False}),
    ]


def test_user_request_to_read_chunks() -> None:
    events = [UserMessage(seq=1, session_id="s", text="the port   parser rejects 70000")]
    events += read_events("s", "c1", "net.py", SRC, 4, 8, 2)
    pairs = pairs_from_events(events, repo="r", file_text={"net.py": SRC}.get, chunker=line_chunker)
    assert [(p.query, p.chunk.symbol, p.evidence, p.query_kind, p.repo) for p in pairs] == [
        ("the port parser rejects 70000", "parse_port", "read", "user", "r")
    ]


def test_search_query_pairs_with_later_reads_and_whole_file_reads_are_skipped() -> None:
    events = [UserMessage(seq=1, session_id="s", text="fix saving the config"),
              ToolCallStarted(seq=2, session_id="s", step=1, index=0, call_id="g", name="grep",
                              args={"pattern": r"def save\b"}),
              ToolResultEvent(seq=3, session_id="s", step=1, index=0, call_id="g", name="grep", ok=True,
                              output="net.py:20: def save(self, path, text):")]
    events += read_events("s", "c1", "net.py", SRC, 1, len(SRC.splitlines()), 4)  # whole file: 4 chunks > 3
    events += [ToolCallStarted(seq=6, session_id="s", step=2, index=0, call_id="ss", name="semantic_search",
                               args={"query": "write config text to a file"})]
    events += read_events("s", "c2", "net.py", SRC, 20, 22, 7)
    pairs = pairs_from_events(events, repo="r", file_text={"net.py": SRC}.get, chunker=line_chunker)
    got = {(p.query, p.query_kind, p.chunk.symbol) for p in pairs}
    assert got == {("fix saving the config", "user", "save"),
                   ("write config text to a file", "semantic_search", "save")}


def test_grep_query_cleaning() -> None:
    assert grep_query(r"def save\b") == "def save"
    assert grep_query(r"parse_port\(") == "parse_port"
    assert grep_query(r"[a-z]+\d*") is None
    assert grep_query("x") is None


def test_edit_maps_to_chunks_of_the_new_text_even_after_earlier_edits() -> None:
    from tools.diffs import unified_diff

    v1 = SRC.replace("import os\n", "import os\nimport sys\nimport re\n")  # shifts everything by 2 lines
    v2 = v1.replace('return f"http://{host}:{port}"', 'return f"https://{host}:{port}"')
    d1 = unified_diff("net.py", SRC.encode(), v1.encode())
    d2 = unified_diff("net.py", v1.encode(), v2.encode())
    assert apply_unified_diff(SRC, d1) == v1 and apply_unified_diff(v1, d2) == v2
    events = [UserMessage(seq=1, session_id="s", text="use https in urls"),
              FileEditEvent(seq=2, session_id="s", call_id="e1", path="net.py", diff=d1),
              FileEditEvent(seq=3, session_id="s", call_id="e2", path="net.py", diff=d2)]
    pairs = pairs_from_events(events, repo="r", file_text={"net.py": SRC}.get, chunker=line_chunker)
    # the import edit touches no function; the second edit is in join_url (found at its shifted place)
    assert [(p.chunk.symbol, p.evidence, p.chunk.start_line) for p in pairs] == [("join_url", "edit", 13)]
    assert "https" in pairs[0].chunk.text


def test_without_file_text_falls_back_to_what_the_session_showed() -> None:
    events = [UserMessage(seq=1, session_id="s", text="how are urls built")]
    events += read_events("s", "c1", "net.py", SRC, 11, 12, 2)
    pairs = pairs_from_events(events, repo="r", chunker=line_chunker)
    assert len(pairs) == 1 and pairs[0].chunk.kind == "window"
    assert pairs[0].chunk.text == "def join_url(host, port):\n    return f\"http://{host}:{port}\""
    # a whole-file read lets the extractor rebuild the file and use real chunks
    events = [UserMessage(seq=1, session_id="s", text="how are urls built")]
    events += read_events("s", "c0", "net.py", SRC, 1, len(SRC.splitlines()), 2)
    events += read_events("s", "c1", "net.py", SRC, 11, 12, 4)
    pairs = pairs_from_events(events, repo="r", chunker=line_chunker)
    assert [(p.chunk.kind, p.chunk.symbol) for p in pairs] == [("function", "join_url")]


def test_failed_reads_unknown_events_and_jsonl(tmp_path: Path) -> None:
    evs = [UserMessage(seq=1, session_id="a", text="find the config loader")]
    evs += read_events("a", "c1", "net.py", SRC, 16, 18, 2)
    bad = ToolResultEvent(seq=4, session_id="a", step=1, index=1, call_id="c9", name="read_file", ok=False,
                          output="error: no such file", data={})
    lines = [e.model_dump_json() for e in evs + [bad]]
    lines.insert(1, json.dumps({"type": "some_future_event", "session_id": "a", "seq": 99}))
    lines.append("not json")
    f = tmp_path / "events.jsonl"
    f.write_text("\n".join(lines) + "\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "net.py").write_text(SRC)
    pairs = pairs_from_jsonl(f, workspace_root=ws, chunker=line_chunker)
    assert [(p.query, p.chunk.symbol, p.repo, p.session_id) for p in pairs] == [
        ("find the config loader", "load", "a", "a")]
    out = tmp_path / "pairs.jsonl"
    assert write_pairs(pairs, out) == 1
    assert read_pairs(out) == pairs and isinstance(read_pairs(out)[0], Pair)


def test_synthetic_pairs_use_the_real_chunker_and_strip_docstrings(tmp_path: Path) -> None:
    pkg = tmp_path / "minipkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "core.py").write_text('''
def add_numbers(a, b):
    """Return the sum of two numbers."""
    return a + b


class Stack:
    def push(self, item):
        """Push an item on top of the stack.

        More text.
        """
        self.items.append(item)
''')
    pairs = synthetic_pairs(pkg)
    assert {(p.query, p.chunk.path, p.repo) for p in pairs} == {
        ("Return the sum of two numbers.", "minipkg/core.py", "minipkg"),
        ("Push an item on top of the stack.", "minipkg/core.py", "minipkg"),
    }
    for p in pairs:
        assert '"""' not in p.chunk.text
        assert ("a + b" in p.chunk.text) or ("append" in p.chunk.text)


def test_pairs_from_a_real_session_log(tmp_path: Path) -> None:
    """A session recorded by the server (SQLite log) yields (request -> read/edited chunk) pairs."""
    from agent.parser import encode_call as call
    from backend.db.engine import make_engine
    from backend.db.log import SessionLog
    from backend.embeddings_train import pairs_from_log
    from tests.backend.conftest import make_api
    from tests.backend.test_sessions_api import wait_turn_end

    db = f"sqlite:///{tmp_path / 'fw.db'}"
    with make_api(db, tmp_path, semantic_search=False) as api:
        s = api.create("alice", [
            call("read_file", {"path": "app.py"}),
            call("edit_file", {"path": "app.py", "search": "a - b", "replace": "a + b"}),
            "fixed",
        ])
        api.client.post(f"/v1/sessions/{s['id']}/messages", json={"text": "add() subtracts instead of adding"},
                        headers=api.h("alice"))
        wait_turn_end(api, s["id"])
    engine = make_engine(db)
    try:
        pairs = pairs_from_log(SessionLog(engine))
    finally:
        engine.dispose()
    assert pairs, "no pairs from a session that read and edited a function"
    assert {p.query for p in pairs} == {"add() subtracts instead of adding"}
    assert {p.evidence for p in pairs} >= {"edit"} and all(p.chunk.symbol == "add" for p in pairs)
    assert all(p.session_id == s["id"] for p in pairs)


def test_tool_and_parameter_names_come_from_the_tool_specs() -> None:
    assert SEARCH_TOOLS == {SemanticSearch.spec.name: "query", Grep.spec.name: "pattern"}
    for spec, param in ((SemanticSearch.spec, "query"), (Grep.spec, "pattern"), (ReadFile.spec, "start_line")):
        assert spec.param(param) is not None


def test_evidence_carries_the_file_text_at_the_time_and_both_queries() -> None:
    events = [UserMessage(seq=1, session_id="s", text="saving"),
              ToolCallStarted(seq=2, session_id="s", step=1, index=0, call_id="ss", name="semantic_search",
                              args={"query": "write  config"})]
    events += read_events("s", "c1", "net.py", SRC, 20, 22, 3)
    (ev,) = evidence_from_events(events, file_text={"net.py": SRC}.get)
    assert ev == Evidence((("saving", "user"), ("write config", "semantic_search")), "s", "read", "net.py",
                          (20, 21, 22), SRC, "\n".join(SRC.splitlines()[19:22]), 20, 22)
