"""write_file: create/overwrite atomically, byte-exact, diffs and edits."""

from __future__ import annotations

import os

import pytest

from tools.base import Tool, ToolContext, ToolError
from tools.workspace import Workspace
from tools.write_file import WriteFile


def test_protocol_and_resources() -> None:
    assert isinstance(WriteFile(), Tool)
    assert WriteFile().resources({"path": "./a/b.txt", "content": ""}).writes == frozenset({"a/b.txt"})


async def test_create_with_parents(workspace: Workspace, ctx: ToolContext) -> None:
    result = await WriteFile().run({"path": "pkg/new/mod.py", "content": "x = 1\n"}, ctx)
    assert result.output == (
        "created pkg/new/mod.py (6 bytes)\n"
        "diff --git a/pkg/new/mod.py b/pkg/new/mod.py\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/pkg/new/mod.py\n@@ -0,0 +1 @@\n+x = 1\n"
    )
    assert result.edits[0].created and result.data["created"] is True
    assert os.stat(workspace.root / "pkg/new/mod.py").st_mode & 0o777 == 0o644


async def test_overwrite(workspace: Workspace, ctx: ToolContext) -> None:
    result = await WriteFile().run({"path": "README.md", "content": "# demo\n"}, ctx)
    assert result.output.startswith("wrote README.md (7 bytes)\ndiff --git a/README.md b/README.md\n")
    assert "-hello world\n" in result.output and not result.edits[0].created
    assert workspace.read_bytes("README.md") == b"# demo\n"


@pytest.mark.parametrize(
    "content",
    ["<tag attr=\"&amp;\">]]></tag>", "a\r\nb\r\n", "no trailing newline", "\ttabs  \n\n\n", "ünïcødé ✓\n", ""],
)
async def test_byte_exact(workspace: Workspace, ctx: ToolContext, content: str) -> None:
    await WriteFile().run({"path": "exact.txt", "content": content}, ctx)
    assert workspace.read_bytes("exact.txt") == content.encode()


async def test_unchanged_content_has_no_edit(ctx: ToolContext) -> None:
    same = "from pkg.core import add\n\nprint(add(1, 2))\n"
    result = await WriteFile().run({"path": "src/main.py", "content": same}, ctx)
    assert result.output == "wrote src/main.py (43 bytes)\n(content unchanged)\n"
    assert result.edits == []


async def test_atomic_no_temp_files_left(workspace: Workspace, ctx: ToolContext) -> None:
    for i in range(5):
        await WriteFile().run({"path": "src/loop.txt", "content": f"{i}\n"}, ctx)
    assert sorted(os.listdir(workspace.root / "src")) == ["loop.txt", "main.py", "pkg"]


async def test_keeps_executable_bit(workspace: Workspace, ctx: ToolContext) -> None:
    await WriteFile().run({"path": "run.sh", "content": "#!/bin/sh\nexit 0\n"}, ctx)
    assert os.stat(workspace.root / "run.sh").st_mode & 0o777 == 0o755


async def test_errors(ctx: ToolContext) -> None:
    with pytest.raises(ToolError, match="is a directory"):
        await WriteFile().run({"path": "src", "content": "x"}, ctx)
    with pytest.raises(ToolError, match="cannot write to '.'"):
        await WriteFile().run({"path": ".", "content": "x"}, ctx)
    with pytest.raises(ToolError, match="not a directory|non-directory"):
        await WriteFile().run({"path": "README.md/child.txt", "content": "x"}, ctx)
