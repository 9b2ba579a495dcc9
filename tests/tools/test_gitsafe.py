"""neutralise_git: planted hooks and program-running config never run when the host's git uses a kept tree."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tools.gitsafe import host_git, neutralise_git
from tools.workspace import Workspace


def host_env(home: Path) -> dict[str, str]:
    """A developer's git: their own (empty) global config, no system config."""
    return {"PATH": os.environ["PATH"], "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_AUTHOR_NAME": "dev", "GIT_AUTHOR_EMAIL": "d@x", "GIT_COMMITTER_NAME": "dev",
            "GIT_COMMITTER_EMAIL": "d@x"}


def plant(repo: Path, marker: Path) -> None:
    """What a hostile model could write into its workspace's .git."""
    subprocess.run(["git", "init", "-q", str(repo)], check=True, capture_output=True)
    hook = repo / ".git" / "hooks" / "pre-commit"
    hook.write_text(f"#!/bin/sh\necho hook >> {marker}\n")
    hook.chmod(0o755)
    prog = repo / "evil.sh"
    prog.write_text(f"#!/bin/sh\necho \"$0 $*\" >> {marker}\nexit 0\n")
    prog.chmod(0o755)
    (repo / "included.cfg").write_text(f"[core]\n\tpager = {prog}\n")
    with open(repo / ".git" / "config", "a") as f:
        f.write(f"[core]\n\tfsmonitor = {prog}\n\thooksPath = .git/hooks\n\tsshCommand = {prog}\n"
                f"\teditor = {prog}\n[diff]\n\texternal = {prog}\n[filter \"x\"]\n\tclean = {prog}\n"
                f"\tsmudge = {prog}\n\tprocess = {prog}\n[alias]\n\tst = !{prog}\n"
                f"[include]\n\tpath = ../included.cfg\n[user]\n\tname = kept\n"
                f"[remote \"origin\"]\n\turl = https://example.invalid/x.git\n")
    (repo / ".gitattributes").write_text("* filter=x diff=x\n")
    (repo / "a.txt").write_text("a\n")


def test_planted_hooks_and_config_do_not_run_after_neutralise(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    repo = tmp_path / "kept"
    plant(repo, marker)
    report = neutralise_git(repo)
    assert report.hooks_disabled == [".git/hooks/pre-commit"]
    assert {"core.fsmonitor", "core.hookspath", "diff.external", "filter.x.clean", "alias.st",
            "include.path"} <= set(report.config_keys_removed)
    env = host_env(tmp_path)
    for args in (["status"], ["add", "-A"], ["commit", "-q", "-m", "x"], ["diff", "HEAD~0"], ["log", "-p"],
                 ["st"]):
        subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, timeout=60)
    assert not marker.exists(), marker.read_text()
    cfg = subprocess.run(["git", "-C", str(repo), "config", "--list", "--local"], env=env,
                         capture_output=True, text=True).stdout
    assert "user.name=kept" in cfg and "remote.origin.url=https://example.invalid/x.git" in cfg
    assert not os.access(repo / ".git" / "hooks.flywheel-disabled" / "pre-commit", os.X_OK)


def test_without_neutralise_the_plant_runs(tmp_path: Path) -> None:
    """The counterpart: shows the test above exercises a real attack."""
    marker = tmp_path / "ran"
    repo = tmp_path / "kept"
    plant(repo, marker)
    subprocess.run(["git", "-C", str(repo), "status"], env=host_env(tmp_path), capture_output=True, timeout=60)
    assert marker.exists()


def test_nested_and_bare_repos_and_outside_gitlinks(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    bare = root / "vendor" / "lib.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True, capture_output=True)
    (bare / "hooks" / "post-update").write_text("#!/bin/sh\n")
    (bare / "config").write_text("[core]\n\tbare = true\n\tfsmonitor = /bin/true\n")
    (root / "sub").mkdir()
    (root / "sub" / ".git").write_text(f"gitdir: {tmp_path / 'elsewhere'}\n")
    (root / "lnk").mkdir()
    os.symlink(str(tmp_path), root / "lnk" / ".git")
    report = neutralise_git(root)
    assert "vendor/lib.git" in report.git_dirs
    assert "core.fsmonitor" in report.config_keys_removed
    assert sorted(report.links_disabled) == ["lnk/.git", "sub/.git"]
    assert not (root / "sub" / ".git").exists() and (root / "sub" / ".git.flywheel-disabled").exists()
    assert not os.path.lexists(root / "lnk" / ".git")


def test_workspace_method_and_host_git_ignore_inherited_git_dir(workspace: Workspace, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "ran"
    plant(workspace.root, marker)
    assert workspace.neutralise_git().changed
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "not-a-repo"))
    out = host_git(workspace.root, "rev-parse", "--git-dir")
    assert out.returncode == 0 and out.stdout.strip() == ".git"
    assert not marker.exists()
