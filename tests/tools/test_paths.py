"""Adversarial paths: every case is refused (or stays a harmless in-tree name) and
nothing outside the workspace is ever read or written, under both resolvers."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.tools.conftest import CANARY
from tools import paths
from tools.base import ToolContext, ToolError
from tools.edit_file import EditFile
from tools.glob import Glob
from tools.grep import Grep
from tools.list_dir import ListDir
from tools.read_file import ReadFile
from tools.workspace import Workspace
from tools.write_file import WriteFile

ESCAPE = r"escapes the workspace"
ABSOLUTE = r"absolute paths are not allowed: use a path relative|absolute paths are not allowed"
NOT_FOUND = r"not found"
TOO_LONG = r"too long"


@dataclass(frozen=True)
class Case:
    id: str
    path: str
    error: str  # regex the refusal must match
    write_ok: bool = False  # a harmless in-tree name: writing it creates a file inside


CORPUS = [
    Case("dotdot", "..", ESCAPE),
    Case("dotdot2", "../..", ESCAPE),
    Case("dotdot-file", "../canary.txt", ESCAPE),
    Case("dot-dotdot", "./../canary.txt", ESCAPE),
    Case("a-up-up", "a/../../x", ESCAPE),
    Case("sub-up-up", "src/../../canary.txt", ESCAPE),
    Case("dots-mixed", "a/./../../..", ESCAPE),
    Case("zigzag", "src/../src/../../etc", ESCAPE),
    Case("abs-passwd", "/etc/passwd", ABSOLUTE),
    Case("abs-root", "/", ABSOLUTE),
    Case("abs-double-slash", "//etc/passwd", ABSOLUTE),
    Case("proc-self-root", "/proc/self/root/etc/passwd", ABSOLUTE),
    Case("link-system", "link_system", ESCAPE),
    Case("link-system-slash", "link_system/", ESCAPE),
    Case("link-canary-abs", "link_canary", ESCAPE),
    Case("chain-a", "chain_a", ESCAPE),
    Case("chain-b", "chain_b", ESCAPE),
    Case("dir-link-root", "rootdir/etc/passwd", ESCAPE),
    Case("dir-link-root-itself", "rootdir", ESCAPE),
    Case("dir-link-root-proc", "rootdir/proc/self/root/etc/passwd", ESCAPE),
    Case("link-parent", "parent/outside/canary.txt", ESCAPE),
    Case("link-parent-itself", "parent", ESCAPE),
    Case("link-parent-twice", "parent/parent/canary.txt", ESCAPE),
    Case("procroot-link", "procroot/etc/passwd", ESCAPE),
    Case("proc-cwd-link", "cwdlink/README.md", ESCAPE),
    Case("relative-link-up", "link/../../", ESCAPE),
    Case("nested-link-up", "sub/up/outside/canary.txt", ESCAPE),
    Case("nested-link-up-itself", "sub/up", ESCAPE),
    Case("deep-relative-escape", "sub/deep/esc", ESCAPE),
    Case("dir-link-outside", "dirlink_out/canary.txt", ESCAPE),
    Case("rel-dir-link-outside", "rel_dirlink_out/canary.txt", ESCAPE),
    Case("dir-link-outside-new", "dirlink_out/new_file.txt", ESCAPE),
    Case("dangling-rel-outside", "dangling_out", ESCAPE),
    Case("dangling-abs-outside", "dangling_abs", ESCAPE),
    Case("abs-link-back-inside", "abs_inside", ESCAPE),
    Case("dev-null-link", "devnull", ESCAPE),
    Case("symlink-loop", "loop1", ESCAPE),
    Case("nul-byte", "README.md\x00/../../etc/passwd", r"NUL byte"),
    Case("empty", "", r"empty path"),
    Case("10kb-name", "a" * 10_000, TOO_LONG),
    Case("300-byte-component", "x/" + "b" * 300, TOO_LONG),
    Case("256-byte-component", "c" * 256, TOO_LONG),
    Case("long-utf8-component", "é" * 128, TOO_LONG),
    Case("fullwidth-dots", "\uff0e\uff0e/\uff0e\uff0e/outside/canary.txt", NOT_FOUND, True),
    Case("one-dot-leaders", "\u2024\u2024/\u2024\u2024/canary.txt", NOT_FOUND, True),
    Case("division-slash", "..\u2215..\u2215canary.txt", NOT_FOUND, True),
    Case("backslashes", "..\\..\\etc\\passwd", NOT_FOUND, True),
    Case("tilde", "~/.ssh/id_rsa", NOT_FOUND, True),
    Case("file-url", "file:///etc/passwd", NOT_FOUND, True),
    Case("percent-encoded", "%2e%2e/%2e%2e/etc/passwd", NOT_FOUND, True),
    Case("windows-device", "\\\\?\\C:\\Windows\\win.ini", NOT_FOUND, True),
    Case("newline-dotdot", "\n../etc/passwd", NOT_FOUND, True),
]


def plant_evil_links(root: Path, outside: Path, sysroot: str) -> None:
    """Symlinks inside the workspace that try to lead out of it.

    ``sysroot`` stands in for ``/``: the real root for read tests, a scratch
    directory under tmp_path for write tests, so that a regression can never
    overwrite a real system file.
    """
    up = os.path.relpath(outside.parent, root)  # e.g. ../../../.. (to tmp_path)
    sysroot = sysroot.rstrip("/")
    (root / "sub" / "deep").mkdir(parents=True)
    links = {
        "link_system": f"{sysroot}/etc/passwd",
        "link_canary": str(outside / "canary.txt"),
        "chain_a": "chain_b",
        "chain_b": "chain_c",
        "chain_c": f"{up}/outside/canary.txt",
        "rootdir": sysroot or "/",
        "parent": "..",
        "procroot": f"/proc/self/root{sysroot}",
        "cwdlink": "/proc/self/cwd",
        "link": "src",
        "sub/up": "../..",
        "sub/deep/esc": f"../../{up}/outside/canary.txt",
        "dirlink_out": str(outside),
        "rel_dirlink_out": f"{up}/outside",
        "dangling_out": f"{up}/outside/created_by_attack.txt",
        "dangling_abs": str(outside / "created_by_attack_abs.txt"),
        "abs_inside": str(root / "README.md"),
        "devnull": f"{sysroot}/dev/null",
        "loop1": "loop2",
        "loop2": "loop1",
    }
    for name, target in links.items():
        os.symlink(target, root / name)


def outside_state(top: Path, ws_root: Path) -> dict[str, str]:
    """Everything under ``top`` except the workspace tree (and its overlay's upper and work
    directories, where the tree's writes land), with content hashes."""
    state: dict[str, str] = {}
    own = {ws_root, ws_root.parent / "upper", ws_root.parent / "work"}
    for dirpath, dirnames, filenames in os.walk(top):
        if Path(dirpath) in own:
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            if p.is_symlink():
                state[str(p)] = "link:" + os.readlink(p)
            elif p.is_file():
                state[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                state[str(p)] = "dir"
    return state


@pytest.fixture
def evil(workspace: Workspace, outside: Path) -> Workspace:
    plant_evil_links(workspace.root, outside, "/")
    return workspace


@pytest.fixture
def evil_for_writes(
    workspace: Workspace, outside: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Workspace:
    """Write targets: every "system" path is a stand-in under tmp_path, and the
    cwd (``/proc/self/cwd``) is tmp_path, so a regression writes only there."""
    fake = tmp_path / "fakeroot"
    (fake / "etc").mkdir(parents=True)
    (fake / "dev").mkdir()
    (fake / "etc" / "passwd").write_text("root:x:0:0 (stand-in)\n")
    (fake / "dev" / "null").write_text("")
    monkeypatch.chdir(tmp_path)
    plant_evil_links(workspace.root, outside, str(fake))
    return workspace


def _no_leak(text: str) -> None:
    assert CANARY not in text
    assert "root:x:0:0" not in text


@pytest.mark.parametrize("case", CORPUS, ids=[c.id for c in CORPUS])
async def test_read_refused(case: Case, evil: Workspace, resolver: str) -> None:
    with pytest.raises(ToolError, match=case.error) as info:
        await ReadFile().run({"path": case.path}, ToolContext(evil))
    _no_leak(str(info.value))


@pytest.mark.parametrize("case", CORPUS, ids=[c.id for c in CORPUS])
async def test_write_never_escapes(
    case: Case, evil_for_writes: Workspace, tmp_path: Path, resolver: str
) -> None:
    ws = evil_for_writes
    before = outside_state(tmp_path, ws.root)
    if case.write_ok:
        result = await WriteFile().run({"path": case.path, "content": "PWNED"}, ToolContext(ws))
        written = ws.root / result.edits[0].path
        assert written.read_text() == "PWNED"
        assert written.resolve().is_relative_to(ws.root)
    else:
        with pytest.raises(ToolError, match=case.error):
            await WriteFile().run({"path": case.path, "content": "PWNED"}, ToolContext(ws))
    assert outside_state(tmp_path, ws.root) == before


@pytest.mark.parametrize("case", CORPUS, ids=[c.id for c in CORPUS])
async def test_edit_never_escapes(
    case: Case, evil_for_writes: Workspace, tmp_path: Path, resolver: str
) -> None:
    ws = evil_for_writes
    before = outside_state(tmp_path, ws.root)
    args = {"path": case.path, "search": "CANARY", "replace": "PWNED"}
    with pytest.raises(ToolError, match=case.error) as info:
        await EditFile().run(args, ToolContext(ws))
    _no_leak(str(info.value))
    assert outside_state(tmp_path, ws.root) == before


DIR_ESCAPES = ["..", "rootdir", "parent", "procroot", "sub/up", "dirlink_out", "rel_dirlink_out",
               "/tmp", "link/../.."]


@pytest.mark.parametrize("path", DIR_ESCAPES)
async def test_directory_tools_refuse_escapes(path: str, evil: Workspace, resolver: str) -> None:
    ctx = ToolContext(evil)
    for tool, args in [
        (ListDir(), {"path": path}),
        (Glob(), {"pattern": "*", "path": path}),
        (Grep(), {"pattern": "CANARY|root:", "path": path}),
    ]:
        with pytest.raises(ToolError, match=f"{ESCAPE}|absolute paths") as info:
            await tool.run(args, ctx)
        _no_leak(str(info.value))


async def test_whole_tree_search_does_not_follow_links_out(evil: Workspace) -> None:
    result = await Grep().run({"pattern": "CANARY|root:x:0:0"}, ToolContext(evil))
    assert result.output == "no matches"
    listing = await Glob().run({"pattern": "**/canary.txt"}, ToolContext(evil))
    assert "no files match" in listing.output


# ------------------------------------------------------------ in-workspace links work


async def test_in_workspace_symlinks_are_followed(workspace: Workspace, resolver: str) -> None:
    root = workspace.root
    os.symlink("src", root / "srclink")
    os.symlink("l2", root / "l1")
    os.symlink("src/pkg/core.py", root / "l2")
    os.symlink("../../README.md", root / "src" / "pkg" / "readme_up")
    ctx = ToolContext(workspace)
    assert "print(add(1, 2))" in (await ReadFile().run({"path": "main_link.py"}, ctx)).output
    assert "print(add(1, 2))" in (await ReadFile().run({"path": "srclink/main.py"}, ctx)).output
    assert "def add" in (await ReadFile().run({"path": "l1"}, ctx)).output
    assert "hello world" in (await ReadFile().run({"path": "src/pkg/readme_up"}, ctx)).output
    assert "core.py" in (await ListDir().run({"path": "srclink/pkg"}, ctx)).output
    assert workspace.real_path("l1") == "src/pkg/core.py"


async def test_write_through_in_workspace_link_writes_target(workspace: Workspace, resolver: str) -> None:
    result = await WriteFile().run({"path": "main_link.py", "content": "x = 1\n"}, ToolContext(workspace))
    assert result.edits[0].path == "src/main.py"
    assert os.readlink(workspace.root / "main_link.py") == "src/main.py"
    assert (workspace.root / "src" / "main.py").read_text() == "x = 1\n"


async def test_write_through_dangling_in_workspace_link_creates_target(
    workspace: Workspace, resolver: str
) -> None:
    os.symlink("src/new_module.py", workspace.root / "dangling")
    result = await WriteFile().run({"path": "dangling", "content": "y = 2\n"}, ToolContext(workspace))
    assert result.edits[0].path == "src/new_module.py" and result.edits[0].created
    assert (workspace.root / "dangling").is_symlink()


def test_normalize() -> None:
    assert paths.normalize(".") == "."
    assert paths.normalize("./a//b/") == "a/b"
    assert paths.normalize("a/b/../c") == "a/c"
    assert paths.normalize("a/..") == "."
    assert paths.resource_key("../x") == "../x"


def test_error_types_are_tool_errors() -> None:
    for exc in (paths.PathEscapeError, paths.PathNotFoundError, paths.PathTypeError):
        assert issubclass(exc, paths.PathError) and issubclass(exc, ToolError)


def test_openat2_is_used_on_this_kernel() -> None:
    if not paths.openat2_available():
        pytest.skip("openat2 not available here")
    assert paths.openat2_available() is True
