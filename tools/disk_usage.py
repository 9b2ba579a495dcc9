"""How much disk a workspace tree uses, for the sandbox's total write cap.

Not guaranteed: the figure is allocated blocks (``st_blocks``), so sparse
files count only what they really hold, and a file hard-linked several times
counts once per name (over-counting only hurts the workspace itself). The
walk does not follow symlinks, and it stops after ``max_entries`` entries:
the result is then a lower bound (``complete`` is False).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

MAX_ENTRIES = 500_000


@dataclass(frozen=True, slots=True)
class Usage:
    bytes: int
    entries: int
    complete: bool


def tree_usage(root: Path, max_entries: int = MAX_ENTRIES) -> Usage:
    """Allocated bytes of everything beneath ``root`` (``root`` itself excluded). For a
    copy-on-write workspace (an overlay mount) only its upper layer — what commands wrote —
    is walked: the read-only source below (a multi-GB virtualenv) is not the session's."""
    from tools.overlay import upper_dir

    root = upper_dir(Path(root)) or Path(root)
    total = entries = 0
    stack = [os.fspath(root)]
    while stack:
        try:
            it = os.scandir(stack.pop())
        except OSError:
            continue
        with it:
            for e in it:
                entries += 1
                if entries > max_entries:
                    return Usage(total, entries - 1, False)
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    stack.append(e.path)
    return Usage(total, entries, True)
