"""glob: ripgrep file listing, .gitignore respected, caps, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.base import WHOLE_TREE, Tool, ToolContext, ToolError
from tools.glob import MAX_RESULTS, Glob
from tools.workspace import Workspace


def test_protocol_and_resources() -> None:
    assert isinstance(Glob(), Tool)
    assert Glob().resources({"pattern": "*"}).reads == frozenset({WHOLE_TREE})


async def test_recursive_pattern_sorted(ctx: ToolContext) -> None:
    result = await Glob().run({"pattern": "**/*.py"}, ctx)
    assert result.output == (
        "3 files match '**/*.py'\nsrc/main.py\nsrc/pkg/__init__.py\nsrc/pkg/core.py\n"
    )
    assert result.data == {"count": 3, "truncated": False}


async def test_path_argument(ctx: ToolContext) -> None:
    result = await Glob().run({"pattern": "*.py", "path": "src/pkg"}, ctx)
    assert result.output.splitlines()[1:] == ["src/pkg/__init__.py", "src/pkg/core.py"]


async def test_gitignore_respected_without_git_dir(workspace: Workspace, ctx: ToolContext) -> None:
    root = workspace.root
    (root / ".gitignore").write_text("build/\n*.log\n")
    (root / "build").mkdir()
    (root / "build" / "gen.py").write_text("x\n")
    (root / "debug.log").write_text("x\n")
    (root / "src" / "trace.log").write_text("x\n")
    assert "build/gen.py" not in (await Glob().run({"pattern": "**/*.py"}, ctx)).output
    # ripgrep's --glob alone would re-include ignored files; the tool must not
    assert (await Glob().run({"pattern": "*.log"}, ctx)).output == "no files match '*.log'"
    assert (await Glob().run({"pattern": "build/**"}, ctx)).output == "no files match 'build/**'"


async def test_hidden_included_git_dir_excluded(workspace: Workspace, ctx: ToolContext) -> None:
    (workspace.root / ".github").mkdir()
    (workspace.root / ".github" / "ci.yml").write_text("on: push\n")
    (workspace.root / ".git").mkdir()
    (workspace.root / ".git" / "config.yml").write_text("x\n")
    out = (await Glob().run({"pattern": "*.yml"}, ctx)).output
    assert ".github/ci.yml" in out and ".git/" not in out


async def test_ignore_files_above_workspace_do_not_apply(
    workspace: Workspace, ctx: ToolContext, tmp_path: Path
) -> None:
    (tmp_path / ".gitignore").write_text("*\n")
    (tmp_path / ".ignore").write_text("*\n")
    out = (await Glob().run({"pattern": "*.md"}, ctx)).output
    assert out == "1 files match '*.md'\nREADME.md\n"


async def test_cap(workspace: Workspace, ctx: ToolContext) -> None:
    (workspace.root / "gen").mkdir()
    for i in range(MAX_RESULTS + 20):
        (workspace.root / "gen" / f"m{i:04d}.txt").touch()
    result = await Glob().run({"pattern": "gen/*.txt"}, ctx)
    lines = result.output.splitlines()
    assert lines[0] == f"{MAX_RESULTS + 20} files match 'gen/*.txt' (showing first {MAX_RESULTS}; " \
                       "narrow the pattern or path to see the rest)"
    assert len(lines) == MAX_RESULTS + 1 and lines[1] == "gen/m0000.txt"
    assert result.data["truncated"] is True


async def test_errors(ctx: ToolContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ToolError, match="error parsing glob"):
        await Glob().run({"pattern": "src/[.py"}, ctx)
    with pytest.raises(ToolError, match="is not a directory"):
        await Glob().run({"pattern": "*", "path": "README.md"}, ctx)
    with pytest.raises(ToolError, match="not found"):
        await Glob().run({"pattern": "*", "path": "nope"}, ctx)
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without rg
    with pytest.raises(ToolError, match=r"ripgrep \(rg\) is not installed: apt-get install ripgrep"):
        await Glob().run({"pattern": "*"}, ctx)


@pytest.mark.parametrize(
    ("pattern", "message"),
    [("*\x00.py", "pattern contains a NUL byte"), ("x" * (130 << 10), "over the 131071-byte limit")],
)
async def test_unpassable_pattern_is_refused_clearly(ctx: ToolContext, pattern: str, message: str) -> None:
    # Before: "internal error in glob: ValueError: embedded null byte" / OSError E2BIG.
    with pytest.raises(ToolError, match=message):
        await Glob().run({"pattern": pattern}, ctx)
