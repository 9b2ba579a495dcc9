"""grep: ripgrep JSON parsing, format, counts, caps, .gitignore, errors, timeout."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tools import grep as grep_mod
from tools import ripgrep
from tools.base import WHOLE_TREE, Tool, ToolContext, ToolError
from tools.grep import Grep
from tools.workspace import Workspace


async def grep(ctx: ToolContext, **args: object) -> str:
    result = await Grep().run(args, ctx)
    assert result.ok
    return result.output


def test_protocol_and_resources() -> None:
    assert isinstance(Grep(), Tool)
    assert Grep().resources({"pattern": "x"}).reads == frozenset({WHOLE_TREE})


async def test_matches_and_counts(ctx: ToolContext) -> None:
    result = await Grep().run({"pattern": r"def \w+"}, ctx)
    assert result.output == (
        "2 matches in 1 files\n"
        "src/pkg/core.py:1: def add(a, b):\n"
        "--\n"
        "src/pkg/core.py:5: def sub(a, b):\n"
    )
    assert result.data == {"matches": 2, "files": 1, "shown": 2, "truncated": False}


async def test_context_lines(ctx: ToolContext) -> None:
    out = await grep(ctx, pattern="return a - b", context=1)
    assert out == (
        "1 matches in 1 files\n"
        "src/pkg/core.py-5- def sub(a, b):\n"
        "src/pkg/core.py:6:     return a - b\n"
    )


async def test_case_insensitive_path_and_glob(ctx: ToolContext) -> None:
    assert await grep(ctx, pattern="HELLO") == "no matches"
    assert "README.md:3: hello world" in await grep(ctx, pattern="HELLO", case_insensitive=True)
    only_py = await grep(ctx, pattern="add", glob="*.py")
    assert "src/main.py:1:" in only_py and "README" not in only_py
    in_file = await grep(ctx, pattern="add", path="src/main.py")
    assert in_file.startswith("2 matches in 1 files\nsrc/main.py:1:")
    in_dir = await grep(ctx, pattern="add", path="src/pkg")
    assert in_dir.splitlines()[1:] == ["src/pkg/core.py:1: def add(a, b):"]


async def test_pattern_starting_with_dash(workspace: Workspace, ctx: ToolContext) -> None:
    workspace.write_bytes("flags.txt", b"use --force here\n")
    assert "flags.txt:1: use --force here" in await grep(ctx, pattern="--force")


async def test_gitignore_respected_even_with_glob(workspace: Workspace, ctx: ToolContext) -> None:
    root = workspace.root
    (root / ".gitignore").write_text("*.log\nvendor/\n")
    (root / "app.log").write_text("needle\n")
    (root / "vendor").mkdir()
    (root / "vendor" / "lib.py").write_text("needle\n")
    (root / "keep.py").write_text("needle\n")
    assert await grep(ctx, pattern="needle") == "1 matches in 1 files\nkeep.py:1: needle\n"
    assert await grep(ctx, pattern="needle", glob="*.log") == "no matches"
    assert (await grep(ctx, pattern="needle", glob="vendor/**")).startswith("no matches")


async def test_match_cap(workspace: Workspace, ctx: ToolContext) -> None:
    workspace.write_bytes("many.txt", b"hit\n" * 300)
    result = await Grep().run({"pattern": "hit"}, ctx)
    head = result.output.splitlines()[0]
    assert head == ("300 matches in 1 files (showing first 200; "
                    "narrow the pattern, path or glob to see the rest)")
    assert result.output.count("many.txt:") == 200 and result.data["truncated"] is True


async def test_output_byte_cap_and_long_lines(workspace: Workspace, ctx: ToolContext) -> None:
    workspace.write_bytes("wide.txt", (b"hit" + b"x" * 2000 + b"\n") * 150)
    result = await Grep().run({"pattern": "hit"}, ctx)
    assert len(result.output.encode()) <= grep_mod.MAX_OUTPUT_BYTES + 300
    assert "[+1503 chars]" in result.output
    assert result.data["matches"] == 150 and result.data["shown"] < 150


async def test_invalid_regex(ctx: ToolContext) -> None:
    with pytest.raises(ToolError, match=r"(?s)invalid regex '\(unclosed'.*unclosed group"):
        await Grep().run({"pattern": "(unclosed"}, ctx)


async def test_bad_arguments(ctx: ToolContext) -> None:
    with pytest.raises(ToolError, match="context must be between 0 and 10"):
        await Grep().run({"pattern": "x", "context": 50}, ctx)
    with pytest.raises(ToolError, match="not found"):
        await Grep().run({"pattern": "x", "path": "nope"}, ctx)


async def test_rg_missing(ctx: ToolContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    await Grep().run({"pattern": "x"}, ctx)  # found on the real PATH (and remembered for it)
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without rg
    with pytest.raises(ToolError, match=r"ripgrep \(rg\) is not installed: apt-get install ripgrep"):
        await Grep().run({"pattern": "x"}, ctx)


async def test_rg_removed_after_it_was_found(ctx: ToolContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "rg"
    fake.symlink_to(ripgrep.shutil.which("rg"))
    monkeypatch.setenv("PATH", str(tmp_path))
    await Grep().run({"pattern": "x"}, ctx)  # remembered: tmp_path/rg
    fake.unlink()
    with pytest.raises(ToolError, match=r"ripgrep \(rg\) is not installed"):
        await Grep().run({"pattern": "x"}, ctx)


async def test_timeout_kills_rg(
    ctx: ToolContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid_file = tmp_path / "pid"
    slow = tmp_path / "slow-rg"
    slow.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 30\n")
    slow.chmod(0o755)
    monkeypatch.setattr(ripgrep, "rg_binary", lambda: str(slow))
    monkeypatch.setattr(ripgrep, "RG_TIMEOUT_S", 0.5)
    started = time.monotonic()
    with pytest.raises(ToolError, match=r"ripgrep timed out after 0.5 s and was stopped"):
        await Grep().run({"pattern": "x"}, ctx)
    assert time.monotonic() - started < 5
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"pattern": "a\x00b"}, "pattern contains a NUL byte"),
        ({"pattern": "x" * (130 << 10)}, "pattern is 133120 bytes, over the 131071-byte limit"),
        ({"pattern": "x", "glob": "*\x00.py"}, "glob contains a NUL byte"),
    ],
)
async def test_unpassable_pattern_is_refused_clearly(ctx: ToolContext, args: dict, message: str) -> None:
    # Before: "internal error in grep: ValueError: embedded null byte" / OSError E2BIG.
    with pytest.raises(ToolError, match=message):
        await Grep().run(args, ctx)


async def test_fifo_path_is_refused_without_blocking(
    workspace: Workspace, ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    os.mkfifo(workspace.root / "pipe")
    monkeypatch.setattr(ripgrep, "RG_TIMEOUT_S", 3.0)  # the old code blocked here until the timeout
    with pytest.raises(ToolError, match="not a regular file or directory"):
        await Grep().run({"pattern": "x", "path": "pipe"}, ctx)
    assert "1 matches" in await grep(ctx, pattern="hello")  # a walk skips the FIFO


async def test_ripgrep_messages_carry_no_host_path(workspace: Workspace, ctx: ToolContext) -> None:
    (workspace.root / ".gitignore").write_text("a[\n")
    for args in ({"pattern": "hello"}, {"pattern": "("}, {"pattern": "x", "path": "nowhere"}):
        try:
            output = (await Grep().run(args, ctx)).output
        except ToolError as exc:
            output = str(exc)
        assert str(workspace.root) not in output
    root = str(workspace.root)
    assert ripgrep.scrub(f"rg: {root}/x.py: denied; {root}", root) == "rg: ./x.py: denied; ."


async def test_concurrent_ripgrep_processes_are_bounded(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    monkeypatch.setattr(ripgrep, "MAX_CONCURRENT", 2)
    running = peak = 0
    real = ripgrep._run_rg

    async def counting(*args: object) -> ripgrep.RgExit:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            await asyncio.sleep(0.05)  # hold the slot long enough for the others to pile up
            return await real(*args)  # type: ignore[arg-type]
        finally:
            running -= 1

    monkeypatch.setattr(ripgrep, "_run_rg", counting)
    results = await asyncio.gather(*(Grep().run({"pattern": "hello"}, ctx) for _ in range(8)))
    assert all(r.ok for r in results)
    assert peak == 2
