"""The end of a session (``flywheel run``, ``flywheel chat``): apply the changes, export a patch, or discard.

:func:`finish` takes the session's :class:`~backend.apply_back.ChangeSet` and what
the user chose on the command line:

* ``apply`` (``--apply``, or ``--yes`` without another choice): apply to the original directory without
  asking; on a conflict nothing is written, the patch is saved to a temporary
  file (so the work is not lost) and the status is 1;
* ``export`` (``--export-patch FILE``): write the patch;
* ``discard`` (``--discard``): nothing;
* ``ask`` (no flag): on a terminal, ask; otherwise say how to apply and do nothing.

Everything shown is passed through :func:`agent.text_safety.inert` (file names are
untrusted). Not guaranteed: the saved patch of a refused apply is left in the
temporary directory for the user to delete.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

from agent.text_safety import inert
from backend.apply_back import ApplyConflict, ApplyError, ApplyResult, ChangeSet, FileState, apply_changes

Choice = Literal["ask", "apply", "export", "discard"]
DEFAULT_PATCH = "flywheel-changes.patch"


@dataclass
class Outcome:
    """What :func:`finish` did: ``status`` 0 or 1, and the apply's result if it applied."""

    status: int
    applied: ApplyResult | None = None
    patch_file: Path | None = None


def end_choice(args: object) -> Choice:
    """The choice the command line made (``--export-patch``, ``--discard``, ``--apply`` or
    ``--yes``; none of them: ask), for ``flywheel run`` and ``flywheel chat``."""
    if getattr(args, "export_patch", None):
        return "export"
    if getattr(args, "discard", False):
        return "discard"
    return "apply" if getattr(args, "apply", False) or getattr(args, "yes", False) else "ask"


def write_patch(changes: ChangeSet, path: Path, *, exclusive: bool = False) -> None:
    """Write the change set's git patch to ``path`` (``exclusive``: refuse to replace a file)."""
    with open(path, "x" if exclusive else "w", encoding="utf-8", newline="") as f:
        f.write(changes.patch())


def finish(
    changes: ChangeSet, target: Path | None, *, choice: Choice, say: TextIO, patch_file: Path | None = None,
    ask: Callable[[str], str | None] | None = None, no_target: str = "", retry_hint: str = "",
    expected: Mapping[str, FileState | None] | None = None, discarded: str = "",
) -> Outcome:
    """Carry out ``choice`` for ``changes``; messages (and prompts) go to ``say``.

    ``target``: the original directory, or None when there is none (``no_target`` says
    why). ``ask``: reads one answer (None at end of input); None means not interactive.
    ``retry_hint``: how to apply later (e.g. ``run again with --apply``). ``discarded``:
    what discarding leaves behind, said with it (a chat's session keeps its changes on
    the server).
    """
    gone = f"; {discarded}" if discarded else ""
    def line(text: str) -> None:
        say.write(inert(text) + "\n")
        say.flush()

    if not changes:
        if changes.skipped:
            line(f"no changes to apply ({len(changes.skipped)} change(s) inside .git are never applied)")
        return Outcome(0)
    if choice == "discard":
        line(f"discarded the session's changes ({changes.summary()}){gone}")
        return Outcome(0)
    if choice == "export":
        assert patch_file is not None
        return _export(changes, patch_file, target, line)
    if choice == "apply":
        if target is None:
            line(f"not applied: {no_target or 'there is no original directory to apply to'}")
            return Outcome(1)
        return _apply(changes, target, line, expected, interactive=False)
    if ask is None or target is None:
        if target is None:
            line(f"({no_target})" if no_target else "(the changes are not applied anywhere)")
        else:
            line(f"not applied to {target} ({changes.summary()}): {retry_hint or 'use --apply'}")
        return Outcome(0)
    while True:
        answer = ask(f"apply to {target}? [a]pply, [e]xport a patch, [d]iscard (default): ")
        pick = (answer or "d").strip().lower()[:1] or "d"
        if answer is None:
            say.write("\n")
        if pick == "a":
            outcome = _apply(changes, target, line, expected, interactive=True)
            if outcome.status == 0:
                return outcome
            continue  # refused: offer export or discard
        if pick == "e":
            name = ask(f"patch file [{DEFAULT_PATCH}]: ")
            path = Path((name or "").strip() or DEFAULT_PATCH).expanduser()
            if path.exists():
                line(f"{path} exists; choose another name")
                continue
            return _export(changes, path, target, line, exclusive=True)
        if pick == "d":
            line(f"discarded the session's changes{gone}")
            return Outcome(0)
        line("answer a, e or d")


def _apply(changes: ChangeSet, target: Path, line: Callable[[str], None],
           expected: Mapping[str, FileState | None] | None, *, interactive: bool) -> Outcome:
    try:
        result = apply_changes(changes, target, expected=expected)
    except ApplyConflict as exc:
        line(f"{exc}")
        if interactive:
            line("export a patch to apply it by hand, or discard")
            return Outcome(1)
        saved = _save_somewhere(changes)
        if saved is not None:
            line(f"the changes are saved as a patch: {saved} (to apply what fits by hand: git apply --reject {saved})")
        return Outcome(1, patch_file=saved)
    except ApplyError as exc:
        line(str(exc))
        return Outcome(1)
    line(result.summary())
    for warning in result.warnings:
        line(f"note: {warning}")
    return Outcome(0, applied=result)


def _export(changes: ChangeSet, path: Path, target: Path | None, line: Callable[[str], None], *,
            exclusive: bool = False) -> Outcome:
    try:
        write_patch(changes, path, exclusive=exclusive)
    except OSError as exc:
        line(f"cannot write the patch to {path}: {exc.strerror or exc}")
        return Outcome(1)
    where = f"in {target} " if target is not None else ""
    line(f"wrote {path} ({changes.summary()}); apply it {where}with: git apply {path.resolve()}")
    return Outcome(0, patch_file=path)


def _save_somewhere(changes: ChangeSet) -> Path | None:
    try:
        fd, name = tempfile.mkstemp(prefix="flywheel-", suffix=".patch")
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(changes.patch())
    except OSError:
        return None
    return Path(name)
