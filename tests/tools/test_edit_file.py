"""edit_file: exactly-once matching, helpful errors, byte-exact atomic writes."""

from __future__ import annotations

import os

import pytest

from tools.base import Tool, ToolContext, ToolError
from tools.edit_file import EditFile
from tools.workspace import Workspace


def test_protocol_and_resources() -> None:
    assert isinstance(EditFile(), Tool)
    res = EditFile().resources({"path": "src/../src/main.py", "search": "a", "replace": "b"})
    assert res.writes == frozenset({"src/main.py"}) and not res.reads


async def test_single_match(workspace: Workspace, ctx: ToolContext) -> None:
    result = await EditFile().run(
        {"path": "src/pkg/core.py", "search": "return a - b", "replace": "return b - a"}, ctx
    )
    assert result.ok
    assert result.output == (
        "diff --git a/src/pkg/core.py b/src/pkg/core.py\n"
        "--- a/src/pkg/core.py\n+++ b/src/pkg/core.py\n"
        "@@ -3,4 +3,4 @@\n \n \n def sub(a, b):\n-    return a - b\n+    return b - a\n"
    )
    assert [e.path for e in result.edits] == ["src/pkg/core.py"]
    assert result.edits[0].diff == result.output and not result.edits[0].created
    assert workspace.read_bytes("src/pkg/core.py").endswith(b"    return b - a\n")
    assert result.data["line"] == 6


async def test_no_match(ctx: ToolContext) -> None:
    with pytest.raises(ToolError, match=r"search text not found in src/main.py.*read_file it again"):
        await EditFile().run({"path": "src/main.py", "search": "nothing like this", "replace": "x"}, ctx)


async def test_no_match_whitespace_hint(ctx: ToolContext) -> None:
    args = {"path": "src/pkg/core.py", "search": "def sub(a, b):\n  return a - b", "replace": "x"}
    with pytest.raises(ToolError, match=r"except for whitespace/indentation exists at line\(s\) 5"):
        await EditFile().run(args, ctx)


async def test_several_matches(workspace: Workspace, ctx: ToolContext) -> None:
    workspace.write_bytes("dup.py", b"x = 1\ny = 2\nx = 1\n\nx = 1\n")
    with pytest.raises(ToolError, match=r"occurs 3 times in dup.py \(starting at lines 1, 3, 5\)"):
        await EditFile().run({"path": "dup.py", "search": "x = 1", "replace": "x = 2"}, ctx)
    assert workspace.read_bytes("dup.py") == b"x = 1\ny = 2\nx = 1\n\nx = 1\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"path": "src/main.py", "search": "", "replace": "x"}, r"search must not be empty; use write_file"),
        ({"path": "src/main.py", "search": "add", "replace": "add"}, r"identical"),
        ({"path": "missing.py", "search": "a", "replace": "b"}, r"not found: 'missing.py'"),
        ({"path": "src", "search": "a", "replace": "b"}, r"is a directory"),
    ],
)
async def test_errors(ctx: ToolContext, args: dict[str, str], message: str) -> None:
    with pytest.raises(ToolError, match=message):
        await EditFile().run(args, ctx)


async def test_byte_exact_special_characters(workspace: Workspace, ctx: ToolContext) -> None:
    original = b'<div a="1">&amp; <![CDATA[x]]> </div>\n'
    workspace.write_bytes("page.html", original)
    await EditFile().run(
        {"path": "page.html", "search": "&amp; <![CDATA[x]]>", "replace": "<b>&lt;]]>\t'\"</b>"}, ctx
    )
    assert workspace.read_bytes("page.html") == b'<div a="1"><b>&lt;]]>\t\'"</b> </div>\n'


async def test_crlf_exact_and_converted(workspace: Workspace, ctx: ToolContext) -> None:
    workspace.write_bytes("win.txt", b"one\r\ntwo\r\nthree\r\n")
    await EditFile().run({"path": "win.txt", "search": "one\r\ntwo", "replace": "1\r\n2"}, ctx)
    assert workspace.read_bytes("win.txt") == b"1\r\n2\r\nthree\r\n"
    result = await EditFile().run({"path": "win.txt", "search": "2\nthree\n", "replace": "2\n3\n"}, ctx)
    assert result.output.startswith("(the file uses CRLF line endings")
    assert workspace.read_bytes("win.txt") == b"1\r\n2\r\n3\r\n"


async def test_delete_text_and_keep_mode(workspace: Workspace, ctx: ToolContext) -> None:
    await EditFile().run({"path": "run.sh", "search": "echo run\n", "replace": ""}, ctx)
    assert workspace.read_bytes("run.sh") == b"#!/bin/sh\n"
    assert os.stat(workspace.root / "run.sh").st_mode & 0o777 == 0o755


async def test_edit_through_symlink_edits_target(workspace: Workspace, ctx: ToolContext) -> None:
    result = await EditFile().run({"path": "main_link.py", "search": "1, 2", "replace": "3, 4"}, ctx)
    assert result.edits[0].path == "src/main.py"
    assert (workspace.root / "main_link.py").is_symlink()
    assert b"add(3, 4)" in workspace.read_bytes("src/main.py")
