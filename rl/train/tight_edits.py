"""The smallest ``edit_file`` calls (:class:`Edit`; :func:`rl.train.demos.tighten` applies them to a task) that make a demonstration's change: each hunk is split
into its runs of changed lines, its unchanged context lines are dropped, and put back one
line at a time only as far as each ``search`` text needs to match exactly once in the file
(``edit_file`` refuses a search text that matches zero times or more than once).

Why: a reference patch's hunks carry three lines of context on each side (the unified-diff
default), so a one-character bug fix became a seven-line ``search`` block that the model had to
reproduce exactly. Agents that edit well send the changed lines plus only the context that
makes them unique; demonstrations should show that, and a small model has fewer tokens to copy
without a slip.

Not guaranteed: that the result is the globally shortest unique window (context grows outward
symmetrically from the changed lines, the fewest lines first, before-context first on ties), or
that a hunk that is pure insertion or deletion keeps fewer than one context line.
"""

from __future__ import annotations

from dataclasses import dataclass
from difflib import SequenceMatcher

__all__ = ["Edit", "occurs_once", "tighten_edit"]


@dataclass(frozen=True, slots=True)
class Edit:
    path: str
    search: str
    replace: str


def occurs_once(data: str, needle: str) -> bool:
    """As ``edit_file`` counts: non-overlapping occurrences."""
    i = data.find(needle)
    return i >= 0 and data.find(needle, i + len(needle)) < 0


def tighten_edit(content: str, edit: Edit) -> list[Edit]:
    """``edit`` as one edit per run of changed lines (a hunk that renames a name on two lines
    apart becomes two edits), each with the fewest context lines for which its ``search`` occurs
    exactly once in ``content`` (the file as it is when the edit applies; the runs apply in
    order). An edit whose full ``search`` does not occur exactly once, or a run that no window
    inside the hunk makes unique, gives ``[edit]`` unchanged (its failure is the runtime's to
    report)."""
    if not occurs_once(content, edit.search):
        return [edit]
    old, new = edit.search.splitlines(keepends=True), edit.replace.splitlines(keepends=True)
    blocks = [op for op in SequenceMatcher(None, old, new, autojunk=False).get_opcodes() if op[0] != "equal"]
    out: list[Edit] = []
    text = content
    for _tag, i1, i2, j1, j2 in blocks:
        # earlier runs are applied: the hunk now reads new[:j1] + old[i1:]
        before, after = new[:j1], old[i2:]
        piece = _window(text, before, old[i1:i2], new[j1:j2], after, edit.path)
        if piece is None:
            return [edit]
        out.append(piece)
        text = text.replace(piece.search, piece.replace, 1)
    return out or [edit]


def _window(text: str, before: list[str], old: list[str], new: list[str], after: list[str],
            path: str) -> Edit | None:
    """The smallest context (``before``'s tail, ``after``'s head) that makes ``old`` unique."""
    for extra in range(len(before) + len(after) + 1):
        for b in range(min(extra, len(before)), -1, -1):
            a = extra - b
            if a > len(after):
                continue
            pre, post = before[len(before) - b:], after[:a]
            search = "".join(pre + old + post)
            if search and occurs_once(text, search):
                return Edit(path, search, "".join(pre + new + post))
    return None
