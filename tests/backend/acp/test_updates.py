"""Events to ACP updates: kinds from declared resources, locations, diff texts from hunks."""

from __future__ import annotations

from pathlib import Path

from agent.events import AssistantDelta, FileEditEvent, ToolCallStarted, ToolResultEvent, UserMessage
from backend.acp.updates import UpdateMapper, hunk_texts, tool_kind
from tools.registry import default_tools

DIFF = """--- a/x.py
+++ b/x.py
@@ -1,3 +1,3 @@
 keep
--- not a header: a removed line starting with --
+++ an added line starting with ++
 tail
"""


def test_hunk_texts_follow_the_hunk_counts() -> None:
    assert hunk_texts(DIFF) == ("keep\n-- not a header: a removed line starting with --\ntail\n",
                                "keep\n++ an added line starting with ++\ntail\n")


def test_kinds_come_from_declared_resources() -> None:
    tools = {t.spec.name: t for t in default_tools(semantic_search=True)}
    kinds = {name: tool_kind(tools[name], {"path": "a.py", "pattern": "x", "command": "ls", "query": "q"})
             for name in tools}
    assert kinds == {"read_file": "read", "list_dir": "search", "glob": "search", "grep": "search",
                     "edit_file": "edit", "write_file": "edit", "run_command": "execute", "semantic_search": "search"}
    assert tool_kind(None, {}) == "other"


def test_a_call_maps_to_a_tool_call_then_updates(tmp_path: Path) -> None:
    m = UpdateMapper(tmp_path)
    assert m.map(UserMessage(text="hi")) == []
    assert m.map(UserMessage(text="hi"), replaying=True)[0].session_update == "user_message_chunk"
    assert m.map(AssistantDelta(step=1, text="ok"))[0].content.text == "ok"
    start = m.map(ToolCallStarted(step=1, index=0, call_id="c", name="edit_file", args={"path": "x.py"}, valid=True))[0]
    assert (start.kind, start.status, start.locations[0].path) == ("edit", "in_progress", str(tmp_path / "x.py"))
    done = m.map(ToolResultEvent(step=1, index=0, call_id="c", name="edit_file", ok=True, output="diff", data={"line": 2}))[0]
    assert done.status == "completed" and done.locations[0].line == 2
    edit = m.map(FileEditEvent(call_id="c", path="x.py", diff=DIFF))[0]
    assert edit.content[0].type == "diff" and edit.content[0].new_text.startswith("keep\n++")
    escape = m.map(ToolCallStarted(step=1, index=1, call_id="d", name="read_file", args={"path": "../../etc/passwd"}, valid=True))[0]
    assert escape.locations == []  # never a location outside the project
