"""``flywheel run --data-dir``: a kept workspace is neutralised before the host's git can touch it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.parser import encode_call

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
def test_hook_and_fsmonitor_planted_by_the_model_never_run_on_the_host(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    src = tmp_path / "proj"
    src.mkdir()
    (src / "a.txt").write_text("a\n")
    subprocess.run(["git", "init", "-q", str(src)], check=True, capture_output=True)
    plant = (f"printf '#!/bin/sh\\necho hook >> {marker}\\n' > .git/hooks/pre-commit && "
             "chmod +x .git/hooks/pre-commit && "
             f"printf '#!/bin/sh\\necho fsmonitor >> {marker}\\n' > .git/fsmon && chmod +x .git/fsmon && "
             "git config core.fsmonitor \"$PWD/.git/fsmon\" 2>/dev/null || "
             "printf '[core]\\n\\tfsmonitor = .git/fsmon\\n' >> .git/config")
    script = tmp_path / "s.json"
    script.write_text(json.dumps([encode_call("run_command", {"command": plant}), "done"]))
    r = subprocess.run([sys.executable, "-m", "backend.cli", "run", "--workspace", str(src), "--data-dir",
                        str(tmp_path / "data"), "--policy", f"scripted:{script}", "plant"],
                       capture_output=True, text=True, timeout=120, cwd=REPO, env={**os.environ, "NO_COLOR": "1"})
    assert r.returncode == 0, r.stderr
    assert ".git/hooks/pre-commit" in r.stdout  # the change summary shows .git changes
    assert "1 hook(s) disabled" in r.stderr and "core.fsmonitor" in r.stderr
    kept = Path(re.search(r"workspace kept at (\S+)", r.stdout).group(1))  # type: ignore[union-attr]
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "d", "GIT_AUTHOR_EMAIL": "d@x", "GIT_COMMITTER_NAME": "d", "GIT_COMMITTER_EMAIL": "d@x"}
    for args in (["status"], ["add", "a.txt"], ["commit", "-q", "-m", "x"]):
        subprocess.run(["git", "-C", str(kept), *args], env=env, capture_output=True, timeout=60)
    assert not marker.exists(), marker.read_text()
