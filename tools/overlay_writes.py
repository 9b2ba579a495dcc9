"""Which paths of a copy-on-write workspace the workspace itself wrote (versus its source's).

A workspace mounted over a host directory in place (``from_dir(src,
in_place=True)``) shows, for every path it has not written, the source's
*current* content: a file the user edits in their editor after the session
opened shows through. Diffs against the starting snapshot would then list the
user's edit as the session's. The overlay knows better: a path the workspace
wrote (created, changed, deleted, renamed) has an entry in its upper
directory or in one of the frozen layers above the source (its ancestors'
changes, see :meth:`tools.workspace_layout.TreeMaker.fork_layout`); every
other path comes from the source. :func:`written_marks` collects those
entries; :meth:`WrittenMarks.covers` answers for one path.

A mark covers a path and everything under it when it is a file, a symlink or
a whiteout (a deleted path), or an opaque or redirected directory (one that
replaced or renamed a source directory). A plain directory entry marks
nothing by itself (overlayfs creates one for every copied-up file's parent).

Not guaranteed: entries are read as the walk meets them, so a command writing
while the marks are collected may or may not be counted; a tree deeper than
:data:`~tools.treewalk.MAX_TREE_DEPTH` is marked at the depth the walk stops.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tools.overlay import is_opaque
from tools.treewalk import TreeItem, TreeLimitError, scan_tree

__all__ = ["WrittenMarks", "written_marks"]

_REDIRECT_XATTR = "trusted.overlay.redirect"


@dataclass(slots=True)
class WrittenMarks:
    """Paths (relative, ``/``-separated) whose whole subtree a workspace wrote."""

    prefixes: set[str] = field(default_factory=set)

    def covers(self, path: str) -> bool:
        """Whether ``path`` (or a directory above it) was written by the workspace."""
        if path in self.prefixes:
            return True
        cut = path.rfind("/")
        while cut > 0:
            if path[:cut] in self.prefixes:
                return True
            cut = path.rfind("/", 0, cut)
        return False


def written_marks(dirs: Iterable[Path]) -> WrittenMarks:
    """The marks of the upper directory and frozen layers ``dirs`` (missing ones are skipped)."""
    marks = WrittenMarks()

    def mark_deep(item: TreeItem, _exc: TreeLimitError) -> None:
        marks.prefixes.add(item.path)

    for top in dirs:
        if not top.is_dir():
            continue

        def descend(item: TreeItem) -> bool:
            if not stat.S_ISDIR(item.st.st_mode):
                marks.prefixes.add(item.path)  # a file, symlink or whiteout
                return False
            if _replaces_source_dir(item):
                marks.prefixes.add(item.path)
                return False
            return True

        for _item in scan_tree(top, descend=descend, on_limit=mark_deep):
            pass
    return marks


def _replaces_source_dir(item: TreeItem) -> bool:
    """An opaque directory (it replaced one of the source's) or a redirected one (a renamed source directory)."""
    try:
        fd = os.open(item.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=item.dir_fd)
    except OSError:
        return False
    try:
        if is_opaque(fd):
            return True
        try:
            os.getxattr(fd, _REDIRECT_XATTR)
        except OSError:
            return False
        return True
    finally:
        os.close(fd)
