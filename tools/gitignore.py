"""Which paths of a workspace ``.gitignore`` hides from snapshots, diffs and change summaries.

Git's rules, matched by ``pathspec``'s ``GitIgnoreSpec``: a ``.gitignore`` in
any directory (patterns relative to it) and the root's ``.git/info/exclude``
(below the root ``.gitignore`` in precedence); a deeper file overrides a
shallower one, within one file the last matching pattern wins, ``!``
re-includes, a pattern ending in ``/`` matches directories only, and nothing
beneath an ignored directory is shown (git does not look inside one).

Two exceptions, both like git's:

* *kept* paths are never ignored (git's tracked files: a workspace passes the
  paths of its starting snapshot, which holds the source's tracked files), and
  the directories on the way to a kept path are entered even when ignored;
  inside such a directory only kept paths are shown;
* ``.git`` directories and everything in them are never ignored (changes
  to a repository's hooks and config must stay visible in diffs).

:class:`IgnoreRules` is stateful: ask about a directory before anything inside
it (the order of :func:`tools.treewalk.scan_tree`), and use one instance per walk.

Not guaranteed: git's global excludes (``core.excludesFile``) and
``$GIT_DIR/info/exclude`` of nested repositories are not read; an ignore file
that is a symlink, not a regular file, or larger than
:data:`MAX_IGNORE_FILE_BYTES` is not read (as if absent); patterns are
decoded as UTF-8 with replacement, so a pattern naming non-UTF-8 bytes may
not match them.
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING

import pathspec

from tools.paths import PathError, open_beneath

if TYPE_CHECKING:
    from tools.blobs import BlobStore
    from tools.snapshots import ManifestEntry

__all__ = ["IgnoreLoader", "IgnoreRules", "MAX_IGNORE_FILE_BYTES", "manifest_loader", "tree_loader"]

MAX_IGNORE_FILE_BYTES = 1 << 20
IGNORE_FILE = ".gitignore"
EXCLUDE_FILE = ".git/info/exclude"

IgnoreLoader = Callable[[str], list[bytes]]
"""``loader(path)`` -> the bytes of the regular file at tree-relative ``path``, as
a one-element list, or ``[]`` when there is none (or it is not readable)."""


class IgnoreRules:
    """Decides, path by path (parents first), what a walk shows."""

    def __init__(self, loader: IgnoreLoader, keep: Collection[str] = ()) -> None:
        self._loader = loader
        self._keep = keep if isinstance(keep, (set, frozenset)) else frozenset(keep)
        self._keep_dirs: set[str] = set()
        for p in self._keep:
            parent = posixpath.dirname(p)
            while parent and parent not in self._keep_dirs:
                self._keep_dirs.add(parent)
                parent = posixpath.dirname(parent)
        self._specs: dict[str, pathspec.PathSpec | None] = {}
        self._hidden: set[str] = set()  # ignored directories entered only for kept paths

    def shown(self, path: str, *, is_dir: bool) -> bool:
        """Whether ``path`` (tree-relative, ``/``-separated) is shown, its parent having been asked first."""
        parent = posixpath.dirname(path)
        if path == ".git" or path.startswith(".git/") or "/.git/" in path or path.endswith("/.git"):
            return True
        matched = parent in self._hidden or self._matches(path, is_dir)
        if not matched:
            return True
        if path in self._keep or (is_dir and path in self._keep_dirs):
            if is_dir:
                self._hidden.add(path)
            return True
        return False

    def _matches(self, path: str, is_dir: bool) -> bool:
        parent = posixpath.dirname(path)
        while True:  # the deepest ignore file with a matching pattern decides
            spec = self._spec(parent)
            if spec is not None:
                rel = path[len(parent) + 1:] if parent else path
                result = spec.check_file(rel + "/" if is_dir else rel)
                if result.include is not None:
                    return bool(result.include)
            if not parent:
                return False
            parent = posixpath.dirname(parent)

    def _spec(self, directory: str) -> pathspec.PathSpec | None:
        if directory in self._specs:
            return self._specs[directory]
        prefix = directory + "/" if directory else ""
        raw = self._loader(EXCLUDE_FILE) if not directory else []
        raw += self._loader(prefix + IGNORE_FILE)
        lines = [line for data in raw for line in data.decode("utf-8", "replace").splitlines()]
        spec = pathspec.GitIgnoreSpec.from_lines(lines) if any(_is_pattern(x) for x in lines) else None
        self._specs[directory] = spec
        return spec


def _is_pattern(line: str) -> bool:
    s = line.strip()
    return bool(s) and not s.startswith("#")


def tree_loader(root: str | os.PathLike[str]) -> IgnoreLoader:
    """Read ignore files from the tree at ``root`` (never following a symlink)."""

    def load(path: str) -> list[bytes]:
        try:
            fd = open_beneath(root, path, os.O_RDONLY | os.O_NONBLOCK, no_symlinks=True)
        except (PathError, OSError):
            return []
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_IGNORE_FILE_BYTES:
                return []
            with os.fdopen(fd, "rb", closefd=False) as f:
                return [f.read(MAX_IGNORE_FILE_BYTES)]
        except OSError:
            return []
        finally:
            os.close(fd)

    return load


def manifest_loader(manifest: Mapping[str, ManifestEntry], blobs: BlobStore) -> IgnoreLoader:
    """Read ignore files from a snapshot's manifest (their bytes from ``blobs``).

    A missing or corrupt blob raises :class:`tools.blobs.SnapshotError`.
    """

    def load(path: str) -> list[bytes]:
        entry = manifest.get(path)
        if entry is None or entry.sha256 is None or entry.size > MAX_IGNORE_FILE_BYTES:
            return []
        return [blobs.get(entry.sha256, path)] if entry.kind == "file" else []

    return load
