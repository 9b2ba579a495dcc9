"""Git-style unified diffs of file contents (``diff --git a/x b/x``), via difflib.

The output is close to ``git diff``'s: ``new file mode`` / ``deleted file
mode`` / ``old mode``/``new mode`` lines, ``/dev/null`` for the missing side,
``\\ No newline at end of file`` markers, ``Binary files a/x and b/x differ``
for binaries, and symlinks shown as a one-line file holding their target
(mode 120000). Files larger than :data:`MAX_DIFF_FILE_BYTES` are not read:
:func:`large_file_diff` gives the header and a one-line "large file, not
shown" note with both sizes. Paths are shown with :func:`tools.paths.display_path`
(non-UTF-8 bytes as ``\\xHH``), so a diff is always valid UTF-8. Not guaranteed: no ``index`` lines, no rename detection, paths
with spaces or control characters are not quoted the way git quotes them,
and hunks may differ from git's (difflib's matcher is not Myers').
"""

from __future__ import annotations

import difflib
import enum
from dataclasses import dataclass

from tools.paths import display_path

MODE_FILE = 0o100644
MODE_EXEC = 0o100755
MODE_LINK = 0o120000
BINARY_SNIFF_BYTES = 8192
CONTEXT_LINES = 3
MAX_DIFF_FILE_BYTES = 1 << 20
"""Largest file (either side) whose content a diff shows; larger ones get a one-line note."""


class ChangeKind(enum.StrEnum):
    ADDED = "added"
    MODIFIED = "modified"
    DELETED = "deleted"


@dataclass(frozen=True, slots=True)
class ChangeEntry:
    """One path that differs between two states of a workspace (``path`` as :func:`display_path` shows it)."""

    path: str
    kind: ChangeKind


def is_binary(data: bytes) -> bool:
    """True if ``data`` has a NUL byte in its first 8 KiB or is not valid UTF-8."""
    if b"\x00" in data[:BINARY_SNIFF_BYTES]:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def split_lines(text: str) -> list[str]:
    """Split on ``\\n`` only (not ``\\r``, form feeds, ...), keeping the line ends."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def unified_diff(
    path: str,
    old: bytes | None,
    new: bytes | None,
    *,
    old_mode: int = MODE_FILE,
    new_mode: int = MODE_FILE,
) -> str:
    """A git-style diff of one file; ``None`` means the side does not exist.

    Returns ``""`` when nothing differs (same bytes and same mode).
    """
    if old is None and new is None:
        return ""
    if old == new and (old_mode == new_mode or old is None):
        return ""
    path = display_path(path)
    out = _header(path, old is not None, new is not None, old_mode, new_mode)
    if old == new:
        return "".join(out)
    a_name = "/dev/null" if old is None else f"a/{path}"
    b_name = "/dev/null" if new is None else f"b/{path}"
    if (old is not None and is_binary(old)) or (new is not None and is_binary(new)):
        out.append(f"Binary files {a_name} and {b_name} differ\n")
        return "".join(out)
    old_lines = split_lines(old.decode("utf-8")) if old is not None else []
    new_lines = split_lines(new.decode("utf-8")) if new is not None else []
    out.append(f"--- {a_name}\n+++ {b_name}\n")
    body = difflib.unified_diff(old_lines, new_lines, n=CONTEXT_LINES, lineterm="\n")
    for i, line in enumerate(body):
        if i < 2:  # difflib's own ---/+++ header lines
            continue
        out.append(line)
        if not line.endswith("\n"):
            out.append("\n\\ No newline at end of file\n")
    return "".join(out)


def _header(path: str, has_old: bool, has_new: bool, old_mode: int, new_mode: int) -> list[str]:
    out = [f"diff --git a/{path} b/{path}\n"]
    if not has_old:
        out.append(f"new file mode {new_mode:o}\n")
    elif not has_new:
        out.append(f"deleted file mode {old_mode:o}\n")
    elif old_mode != new_mode:
        out.append(f"old mode {old_mode:o}\nnew mode {new_mode:o}\n")
    return out


def large_file_diff(
    path: str, old_size: int | None, new_size: int | None, *, old_mode: int = MODE_FILE, new_mode: int = MODE_FILE,
) -> str:
    """The diff of a file too large to show (``None``: that side does not exist): header and a note."""
    path = display_path(path)
    out = _header(path, old_size is not None, new_size is not None, old_mode, new_mode)
    sizes = " -> ".join(f"{n} bytes" if n is not None else "none" for n in (old_size, new_size))
    out.append(f"Large file a/{path} and b/{path} differ ({sizes}); not shown: diffs show files up to "
               f"{MAX_DIFF_FILE_BYTES >> 20} MiB\n")
    return "".join(out)
