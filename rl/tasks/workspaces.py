"""Build a task's starting workspace, apply patches, fetch pinned sdists.

:func:`materialise` turns a :class:`rl.tasks.spec.Task`'s source into a new
:class:`tools.workspace.Workspace` whose base snapshot is the task's starting
state (grading restores the task's tests from that base, so rollouts must run
on it or on a fork of it). :func:`apply_patch` applies a unified diff with the
host's ``git apply`` (which refuses paths outside the tree and writes through
no symlink). :func:`fetch_sdist` downloads ``name==version`` with ``pip
download --no-deps --no-binary :all:``, checks its sha256 and caches the
archive under ``cache_dir/NAME-VERSION/`` (a cached archive is never
downloaded again); :func:`unpack_sdist` unpacks it (tar members through
tarfile's ``data`` filter: no absolute paths, ``..``, links out or devices).
This is the one sdist implementation: RL's real-code tasks
(:mod:`rl.tasks.realcode`) and the search benchmarks use it.

Not guaranteed: ``pip download`` needs the package index (or a pip
configured mirror); offline, an sdist that is not cached fails with
:class:`TaskSourceError`. Without a pinned sha256 the first archive fetched
is trusted (and its hash is what a task records). Patches are text; binary
hunks are not supported.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from rl.tasks.spec import GeneratedSource, GitSource, SdistSource, Task
from tools.gitsafe import host_env
from tools.workspace import Workspace, WorkspaceStore

__all__ = ["TaskSourceError", "apply_patch", "check_sdist_name", "default_sdist_cache", "fetch_sdist", "materialise",
           "sha256_file", "unpack_sdist", "write_files"]

_ARCHIVES = (".tar.gz", ".tgz", ".zip")
# PEP 508 distribution names; versions: PEP 440's characters (pip rejects what is not a version)
_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,126}[A-Za-z0-9])?")
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]{0,63}")


class TaskSourceError(RuntimeError):
    """A task's starting workspace could not be built (download, checksum, patch)."""


def write_files(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")


def apply_patch(root: str | os.PathLike[str], patch: str, *, what: str = "patch") -> None:
    """Apply a unified diff (``a/``, ``b/`` prefixes) to the tree at ``root``; all or nothing."""
    if not patch:
        return
    root = os.path.realpath(root)
    # GIT_CEILING_DIRECTORIES: never treat an enclosing repository as the tree (paths stay root-relative)
    env = {**host_env(), "GIT_CEILING_DIRECTORIES": os.path.dirname(root)}
    proc = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], cwd=root, input=patch.encode(),
                          capture_output=True, env=env, timeout=60)
    if proc.returncode != 0:
        raise TaskSourceError(f"{what} does not apply: {proc.stderr.decode(errors='replace').strip()[:1000]}")


def check_sdist_name(name: str, version: str) -> None:
    """Refuse a name or version that is not a distribution name / version: they become a cache
    directory name and a pip requirement, so ``../x`` or ``a; b`` must never reach either."""
    if not _NAME.fullmatch(name):
        raise TaskSourceError(f"sdist name {name!r} is not a distribution name (letters, digits, '.', '_', '-')")
    if not _VERSION.fullmatch(version) or ".." in version:
        raise TaskSourceError(f"sdist {name}: version {version!r} is not a version (e.g. 1.0.0)")


def default_sdist_cache() -> Path:
    """``~/.cache/flywheel/sdists``: where sdists are cached unless a caller names a directory
    (``flywheel rl tasks build``, :func:`materialise` in rollout workers, the search benchmarks)."""
    return Path.home() / ".cache" / "flywheel" / "sdists"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_sdist(name: str, version: str, cache_dir: Path, *, sha256: str | None = None,
                timeout_s: float = 180.0) -> Path:
    """The archive of sdist ``name==version`` in ``cache_dir`` (downloaded once).

    With ``sha256``, a cached or downloaded archive with another hash raises
    :class:`TaskSourceError` (a cached mismatch is deleted first, then fetched again).
    """
    check_sdist_name(name, version)
    d = Path(cache_dir) / f"{name}-{version}"
    d.mkdir(parents=True, exist_ok=True)
    for attempt in range(2):
        archives = sorted(a for a in d.iterdir() if a.name.endswith(_ARCHIVES))
        if archives:
            got = sha256_file(archives[0])
            if sha256 is None or got == sha256:
                return archives[0]
            archives[0].unlink()  # never keep an archive that is not the pinned one
            if attempt:
                raise TaskSourceError(f"sdist {name}=={version}: sha256 {got} does not match the pinned {sha256}")
        with tempfile.TemporaryDirectory(dir=d) as tmp:
            try:
                p = subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                                    "-q", "--disable-pip-version-check", f"{name}=={version}", "-d", tmp],
                                   capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise TaskSourceError(f"pip download {name}=={version} timed out after {timeout_s:.0f}s") from None
            got_files = [a for a in Path(tmp).iterdir() if a.name.endswith(_ARCHIVES)]
            if p.returncode != 0 or not got_files:
                raise TaskSourceError(f"pip download {name}=={version} failed: {p.stderr.strip()[-500:]}")
            os.replace(got_files[0], d / got_files[0].name)
    raise AssertionError("unreachable")


def unpack_sdist(archive: Path, dest: Path) -> Path:
    """Unpack into ``dest``; returns the archive's single top-level directory."""
    dest.mkdir(parents=True, exist_ok=True)
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(dest)
    else:
        with tarfile.open(archive) as tf:
            tf.extractall(dest, filter="data")
    tops = list(dest.iterdir())
    if len(tops) != 1 or not tops[0].is_dir():
        raise TaskSourceError(f"{archive.name}: expected one top-level directory, found {len(tops)} entries")
    return tops[0]


def materialise(task: Task, store: WorkspaceStore, *, cache_dir: Path | None = None) -> Workspace:
    """A new workspace at ``task``'s starting state (its base snapshot). ``cache_dir``
    holds downloaded sdists (default :func:`default_sdist_cache`, the cache ``flywheel rl
    tasks build`` fills, so rollout workers reuse what the build downloaded)."""
    src = task.source
    if isinstance(src, GitSource):
        ws = store.from_git(src.repo, src.commit)
        if src.patch:
            try:
                apply_patch(ws.root, src.patch, what=f"task {task.id}: source.patch")
            except TaskSourceError:
                ws.delete()
                raise
            ws = _rebase(ws, store)
        return ws
    with tempfile.TemporaryDirectory(prefix="flywheel-task-") as tmp:
        if isinstance(src, GeneratedSource):
            root = Path(tmp) / "tree"
            root.mkdir()
            write_files(root, src.files)
        else:
            assert isinstance(src, SdistSource)
            archive = fetch_sdist(src.name, src.version, cache_dir or default_sdist_cache(), sha256=src.sha256)
            root = unpack_sdist(archive, Path(tmp) / "u")
        apply_patch(root, src.patch, what=f"task {task.id}: source.patch")
        return store.from_dir(root)


def _rebase(ws: Workspace, store: WorkspaceStore) -> Workspace:
    """A workspace whose base is ``ws``'s current state (after a patch)."""
    snap = ws.snapshot()
    out = store.from_snapshot(snap)
    ws.delete()
    return out
