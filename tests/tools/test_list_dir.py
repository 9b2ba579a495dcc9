"""list_dir: sorted entries, markers for dirs and links, caps, errors."""

from __future__ import annotations

import pytest

from tools.base import WHOLE_TREE, Tool, ToolContext, ToolError
from tools.list_dir import MAX_ENTRIES, ListDir
from tools.workspace import Workspace


def test_protocol_and_resources() -> None:
    assert isinstance(ListDir(), Tool)
    assert ListDir().resources({}).reads == frozenset({WHOLE_TREE})


async def test_root_listing(ctx: ToolContext) -> None:
    result = await ListDir().run({}, ctx)
    assert result.output == (
        "README.md\ndata.bin\nempty/\nmain_link.py -> src/main.py\nrun.sh\nsrc/\n"
    )
    assert result.data == {"count": 6, "truncated": False}


async def test_subdir_and_empty(ctx: ToolContext) -> None:
    assert (await ListDir().run({"path": "src"}, ctx)).output == "main.py\npkg/\n"
    assert (await ListDir().run({"path": "empty"}, ctx)).output == "empty: empty directory"


async def test_cap(workspace: Workspace, ctx: ToolContext) -> None:
    many = workspace.root / "many"
    many.mkdir()
    for i in range(MAX_ENTRIES + 5):
        (many / f"f{i:05d}").touch()
    result = await ListDir().run({"path": "many"}, ctx)
    lines = result.output.splitlines()
    assert len(lines) == MAX_ENTRIES + 1 and lines[0] == "f00000"
    assert lines[-1].startswith("[... 5 more entries not shown (1005 in total)")
    assert result.data["truncated"] is True


async def test_errors(ctx: ToolContext) -> None:
    with pytest.raises(ToolError, match=r"README.md is a file, not a directory \(use read_file\)"):
        await ListDir().run({"path": "README.md"}, ctx)
    with pytest.raises(ToolError, match="not found"):
        await ListDir().run({"path": "nope"}, ctx)
