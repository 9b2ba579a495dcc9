"""The executor's result gate, with the real file tools: byte caps, no host paths, non-UTF-8 names."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.calls import ToolCall
from agent.executor import Executor
from tools.base import MAX_EDIT_DIFF_BYTES, MAX_RESULT_BYTES, ToolContext, ToolResult
from tools.edit_file import EditFile
from tools.glob import Glob
from tools.list_dir import ListDir
from tools.read_file import ReadFile
from tools.write_file import WriteFile
from tools.workspace import Workspace, WorkspaceStore

TOOLS = {t.spec.name: t for t in (ReadFile(), ListDir(), Glob(), EditFile(), WriteFile())}
CAP = MAX_RESULT_BYTES


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Workspace]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("alpha\n")
    w = WorkspaceStore(tmp_path / "store").from_dir(src)
    yield w
    w.delete()


async def run(ws: Workspace, name: str, **args: object) -> ToolResult:
    ex = Executor(TOOLS, ToolContext(workspace=ws))
    ex.submit(ToolCall(0, "c0", name, dict(args)))
    (outcome,) = await ex.results()
    return outcome.result


def size(text: str) -> int:
    return len(text.encode())


# ---------------------------------------------------------------- byte caps (the three cases from the issue)


async def test_edit_of_a_one_line_file_is_capped(ws: Workspace) -> None:
    line = "x" * (900 << 10)  # under the diff limit: the diff holds the old and the new line
    (ws.root / "one.txt").write_text("START" + line)
    result = await run(ws, "edit_file", path="one.txt", search="START", replace="BEGIN")
    assert result.ok and size(result.output) <= CAP
    assert "[... output cut: edit_file returned" in result.output and "The edit was applied" in result.output
    assert all(size(e.diff) <= MAX_EDIT_DIFF_BYTES for e in result.edits)
    assert (ws.root / "one.txt").read_text().startswith("BEGINxxx")


async def test_edit_of_a_10mb_one_line_file_returns_a_small_result(ws: Workspace) -> None:
    (ws.root / "ten.txt").write_text("START" + "x" * (10 << 20))
    result = await run(ws, "edit_file", path="ten.txt", search="START", replace="BEGIN")
    assert result.ok and size(result.output) < 4096 and "not shown" in result.output


async def test_list_dir_of_long_symlinks_is_capped(ws: Workspace) -> None:
    d = ws.root / "links"
    d.mkdir()
    for i in range(1000):
        os.symlink("t" * 4000, d / f"{i:04d}-{'n' * 200}")
    result = await run(ws, "list_dir", path="links")
    assert result.ok and size(result.output) <= CAP
    assert "more entries not shown (1000 in total)" in result.output


@pytest.mark.skipif(shutil.which("rg") is None, reason="ripgrep is not installed")
async def test_glob_of_long_paths_is_capped_by_the_executor(ws: Workspace) -> None:
    deep = ws.root / "/".join(["p" * 200] * 15)
    deep.mkdir(parents=True)
    for i in range(600):
        (deep / f"{i:04d}{'f' * 200}.txt").touch()
    result = await run(ws, "glob", pattern="*.txt")
    assert result.ok and size(result.output) <= CAP
    assert "[... output cut: glob returned" in result.output and "narrower pattern" in result.output
    assert result.data["output_cut"] > CAP


# ---------------------------------------------------------------- no host paths


async def test_file_tool_errors_never_show_the_host_root(ws: Workspace) -> None:
    root = str(ws.root)
    (ws.root / "dir").mkdir()
    os.symlink("missing/target.txt", ws.root / "dangling")
    long_path = "q" * 300 + "/f"  # a component over NAME_MAX: ENAMETOOLONG wherever the workspace lives
    cases = [
        ("read_file", {"path": "dir"}), ("read_file", {"path": "a.txt/x"}), ("read_file", {"path": "dangling"}),
        ("read_file", {"path": long_path}), ("edit_file", {"path": "dir", "search": "a", "replace": "b"}),
        ("edit_file", {"path": "dangling", "search": "a", "replace": "b"}),
        ("write_file", {"path": "a.txt/x", "content": "x"}), ("write_file", {"path": "dir", "content": "x"}),
        ("write_file", {"path": long_path, "content": "x"}), ("list_dir", {"path": "a.txt"}),
        ("list_dir", {"path": "dangling"}), ("list_dir", {"path": "../x"}), ("read_file", {"path": "/etc/passwd"}),
    ]
    for name, args in cases:
        result = await run(ws, name, **args)
        assert not result.ok, (name, args, result.output)
        assert root not in result.output and str(ws.store.root) not in result.output, (name, args, result.output)


async def test_an_oserror_from_a_vanished_workspace_is_relative(ws: Workspace) -> None:
    store_root = str(ws.store.root)
    ws.delete()
    for name, args in (("read_file", {"path": "a.txt"}), ("write_file", {"path": "b.txt", "content": "x"}),
                       ("list_dir", {"path": "."})):
        result = await run(ws, name, **args)
        assert not result.ok and store_root not in result.output, result.output


# ---------------------------------------------------------------- non-UTF-8 names


async def test_non_utf8_names_round_trip_through_every_file_tool(ws: Workspace) -> None:
    raw = b"caf\xff.txt"
    with open(os.path.join(os.fsencode(ws.root), raw), "wb") as f:
        f.write(b"one\ntwo\n")
    listing = await run(ws, "list_dir", path=".")
    assert "caf\\xff.txt" in listing.output
    listing.output.encode("utf-8")  # valid UTF-8 for the model
    shown = "caf\\xff.txt"
    read = await run(ws, "read_file", path=shown)
    assert read.ok and "two" in read.output
    edit = await run(ws, "edit_file", path=shown, search="two", replace="deux")
    assert edit.ok and edit.edits[0].path == shown and "+deux" in edit.output
    write = await run(ws, "write_file", path=shown, content="trois\n")
    assert write.ok and write.edits[0].path == shown and not write.data["created"]
    assert sorted(os.listdir(os.fsencode(ws.root))) == [b"a.txt", raw]
    with open(os.path.join(os.fsencode(ws.root), raw), "rb") as f:
        assert f.read() == b"trois\n"
    diff = ws.diff()
    assert "diff --git a/caf\\xff.txt b/caf\\xff.txt\nnew file mode 100644\n" in diff
    diff.encode("utf-8")
    assert [c.path for c in ws.changed_paths()] == [shown]
    snap = ws.snapshot()
    os.unlink(os.path.join(os.fsencode(ws.root), raw))
    ws.restore(snap)
    assert raw in os.listdir(os.fsencode(ws.root))
    assert ws.store.load_snapshot(snap.id) == snap


async def test_a_literal_backslash_name_wins_over_the_escape(ws: Workspace) -> None:
    (ws.root / "lit\\xff").write_text("literal\n")
    result = await run(ws, "read_file", path="lit\\xff")
    assert result.ok and "literal" in result.output
