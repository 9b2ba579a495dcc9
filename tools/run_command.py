"""``run_command``: run a shell command in the workspace, inside the sandbox.

The command string is passed byte-exact to ``bash -c`` (only checked for
being blank, for NUL bytes and for the 128 KiB argument limit). Every call is
a fresh shell: the working directory and environment do not carry over
between calls, files in the workspace do.

Ordering (:meth:`RunCommand.resources`): a command may touch any path, but it
is its own sandboxed process, so commands of one step run *concurrently* with
each other and with reads and searches (``read_file``, ``grep``, ``glob``,
``list_dir``); they keep call order only against file edits
(``edit_file``, ``write_file``): an edit followed by a test run must test the
edited code, and a command that regenerates a file must not interleave with
an edit of that file.

While it runs, the command's output goes to the call's output listener
(:mod:`tools.progress`: the session streams it to clients as
``tool_output_delta`` events); the result is what the model reads.

Not guaranteed: the isolation is whatever ``ctx.sandbox`` provides (see
:mod:`tools.sandbox`); this tool adds no checks of its own on what a command
does. Two commands of one step that touch the same files race (as two shell
jobs would), and a read or search issued with a command may or may not see
what the command writes: to order them, chain them in one command (``a &&
b``) or issue them in separate steps.
"""

from __future__ import annotations

import codecs
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from tools.argv import ArgvError
from tools.base import (
    WHOLE_TREE,
    ParamSpec,
    ParamType,
    Resources,
    ToolContext,
    ToolError,
    ToolResult,
    ToolSpec,
)
from tools.progress import OutputListener, current_listener
from tools.sandbox import CommandResult, SandboxLimits

_DESCRIPTION = """\
Run a shell command in the workspace root with bash and return its exit code and \
combined stdout+stderr.
Sandboxed: the workspace is at /workspace (the working directory); no network access; \
only the system directories (/usr, /etc, ...) are visible outside it, read-only; /tmp is \
private to this call and discarded afterwards.
Each call is a fresh shell: `cd` and environment variables do not persist between \
calls, but files written in the workspace do.
Commands in one step run at the same time (and alongside reads and searches); file \
edits before or after a command in the step are applied in call order. If one command \
needs another's result, chain them in one call (`a && b`).
Limits: a timeout (default {default} s, at most {max} s; the whole process tree is \
killed when it expires, including background jobs), {memory} MiB of memory, {pids} \
processes, {disk}and only the first and last {output} KiB of output are shown."""


class RunCommand:
    """The ``run_command`` tool. Limits other than the timeout come from ``limits``."""

    def __init__(
        self,
        *,
        limits: SandboxLimits | None = None,
        default_timeout_s: int = 60,
        max_timeout_s: int = 600,
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.default_timeout_s = default_timeout_s
        self.max_timeout_s = max_timeout_s
        self.spec = ToolSpec(
            name="run_command",
            description=_DESCRIPTION.format(
                default=default_timeout_s,
                max=max_timeout_s,
                memory=self.limits.memory_bytes >> 20,
                pids=self.limits.max_pids,
                disk=_disk_phrase(self.limits),
                output=self.limits.output_bytes >> 10,
            ),
            params=(
                ParamSpec("command", ParamType.TEXT, "The shell command (run with bash -c)."),
                ParamSpec(
                    "timeout",
                    ParamType.INTEGER,
                    f"Seconds before the command is killed (1-{max_timeout_s}).",
                    required=False,
                    default=default_timeout_s,
                ),
            ),
        )

    def resources(self, args: Mapping[str, Any]) -> Resources:
        # A command may read or write anything, as its own process: ordered
        # against file edits, concurrent with other commands and with reads.
        return Resources(reads=frozenset({WHOLE_TREE}), process_writes=frozenset({WHOLE_TREE}))

    def timeout_for(self, args: Mapping[str, Any]) -> int:
        raw = args.get("timeout")
        timeout = self.default_timeout_s if raw is None else int(raw)
        return max(1, min(timeout, self.max_timeout_s))

    async def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        command = args.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ToolError("command is empty: give the shell command to run")
        if ctx.sandbox is None:
            raise ToolError("commands are disabled: no sandbox is configured")
        limits = dataclasses.replace(self.limits, timeout_s=float(self.timeout_for(args)))
        listener = current_listener()
        try:
            if listener is None:  # nobody watches: the sandbox need not support live output
                result = await ctx.sandbox.run(command, ctx.workspace.root, limits)
            else:
                result = await ctx.sandbox.run(command, ctx.workspace.root, limits, on_output=_decoding(listener))
        except ArgvError as exc:
            raise ToolError(str(exc)) from None
        return ToolResult(
            ok=result.exit_code == 0 and not result.timed_out and not result.disk_limit_hit,
            output=f"{header(result, limits)}\n{result.output or '(no output)'}",
            data=dataclasses.asdict(result),
        )


def _decoding(listener: OutputListener) -> Callable[[bytes], None]:
    """Raw output chunks to text for ``listener``: UTF-8, a character split between
    chunks kept whole, invalid bytes replaced (as the result's output does)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(chunk: bytes) -> None:
        text = decoder.decode(chunk)
        if text:
            listener(text)

    return feed


def header(result: CommandResult, limits: SandboxLimits) -> str:
    """One line for the model: how the command ended.

    The duration is left out on purpose (it is in ``data``): a deterministic
    command then gives the same result on every run, which replay relies on.
    """
    parts: list[str] = []
    if result.timed_out:
        parts.append(f"timed out after {limits.timeout_s:g} s (process tree killed)")
    elif result.oom_killed:
        parts.append(f"killed: out of memory (limit {limits.memory_bytes >> 20} MiB)")
    elif result.output_limit_hit:
        parts.append(f"killed: output exceeded {limits.kill_output_bytes} bytes")
    if result.exit_code is not None:
        parts.append(f"exit code {result.exit_code}")
    elif result.signal is not None and not result.timed_out:
        parts.append(f"killed by signal {result.signal}")
    if result.truncated:
        parts.append(f"output truncated ({result.output_bytes_total} bytes in total)")
    if result.disk_limit_hit and result.workspace_bytes is not None:
        parts.append(
            f"workspace is over its disk cap ({_mib(result.workspace_bytes)} MiB used, cap "
            f"{_mib(limits.disk_bytes)} MiB): delete large files before running more commands"
        )
    return " · ".join(parts)


def _disk_phrase(limits: SandboxLimits) -> str:
    parts = []
    if limits.file_bytes is not None:
        parts.append(f"files of at most {_mib(limits.file_bytes)} MiB")
    if limits.disk_bytes is not None:
        parts.append(f"{_mib(limits.disk_bytes)} MiB for the whole workspace (checked after each command)")
    return "".join(f"{p}, " for p in parts)


def _mib(n: int | None) -> str:
    return "unlimited" if n is None else f"{n / (1 << 20):g}"
