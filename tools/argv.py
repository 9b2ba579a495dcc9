"""What a value must satisfy to be passed to a program as one argv string.

Tools that start processes (``run_command`` through the sandbox, ``grep`` and
``glob`` through ripgrep) hand model-written text to ``execve``. The kernel
refuses two things there, and Python reports them as exceptions that would
surface as "internal error": a NUL byte (C strings end at NUL) and a single
argument longer than ``MAX_ARG_STRLEN`` (32 pages: 128 KiB on Linux). This
module turns both into one clear refusal, checked before anything is spawned.

Not guaranteed: the *total* size of argv plus the environment is also capped
by the kernel (a quarter of the stack limit, normally 2 MiB or more); the
callers here pass one long value at most, so only the per-argument limit is
checked.
"""

from __future__ import annotations

MAX_ARG_BYTES = 128 * 1024 - 1
"""Longest argument ``execve`` accepts on Linux (MAX_ARG_STRLEN, including the NUL)."""


class ArgvError(ValueError):
    """A value that cannot be passed as a process argument; the message says why."""


def check_arg(label: str, value: str) -> None:
    """Raise :class:`ArgvError` when ``value`` cannot be one argv string.

    ``label`` names the value in the message ("pattern", "command").
    """
    if "\x00" in value:
        at = value.index("\x00")
        raise ArgvError(
            f"{label} contains a NUL byte (at character {at}); NUL cannot be passed to a "
            f"program: remove it (to match or print a NUL byte, write it as an escape such as \\x00)"
        )
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_ARG_BYTES:
        hint = "write the script to a file with write_file and run that file" if label == "command" else "shorten it"
        raise ArgvError(
            f"{label} is {size} bytes, over the {MAX_ARG_BYTES}-byte limit for one program argument: {hint}"
        )
