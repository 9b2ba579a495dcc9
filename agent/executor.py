"""Run a step's tool calls concurrently, in a safe order, results in call order.

Every call starts the moment it is submitted (the parser submits each call as
its closing tag arrives). A call waits only for earlier calls it conflicts
with — one writes what the other reads or writes, per
:meth:`tools.base.Resources.conflicts_with` — so two reads of one file run in
parallel while an edit and a later read of that file run in call order.
Results are returned in call order whatever order they finish in.

What is serialised, and why: a shell command may touch any path, but it is
its own sandboxed process (``Resources.process_writes``). Commands of one
step therefore run concurrently with each other and with reads and searches;
they keep call order only against file edits (``edit_file``, ``write_file``),
in both directions, because an edit followed by a test run must test the
edited code and an edit must not interleave with a command rewriting its
file. Two commands of a step race like two shell jobs, and a read issued
with a command may or may not see what it writes (``tools.run_command``);
the model orders such work with ``a && b`` or separate steps.

Cancellation (a user interrupt) cancels every running tool; tools are written
so that cancellation leaves no half-written file (atomic writes) and no
process behind (the sandbox kills its process tree).

Every result passes through one gate before anyone sees it: its output is
capped at :data:`tools.base.MAX_RESULT_BYTES` (and each edit's diff at
:data:`tools.base.MAX_EDIT_DIFF_BYTES`) with a note saying what was cut and
how to see more, and the workspace's host location (its root, the store's
root) is replaced by workspace-relative text, so no result depends on where
the workspace lives. An ``OSError`` escaping a tool becomes an error result
with its reason and relative path.

Not guaranteed: ordering between calls that alias one file through symlinks,
or between different executors on one workspace; host paths other than the
workspace's and its store's are not recognised.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from agent.calls import CallRejected, ToolCall
from tools.base import Resources, Tool, ToolContext, ToolError, ToolResult

log = logging.getLogger(__name__)

MORE_HINTS: Mapping[str, str] = {
    "read_file": "Read a smaller range with start_line/end_line.",
    "list_dir": "List a subdirectory, or use glob with a narrower pattern.",
    "glob": "Use a narrower pattern, or a path deeper in the tree.",
    "grep": "Use a more specific pattern, or limit it with path or a glob.",
    "edit_file": "The edit was applied; read_file the changed lines (start_line/end_line) to check them.",
    "write_file": "The file was written; read_file it with start_line/end_line to check parts of it.",
    "run_command": "Redirect the output to a file and grep or read_file it, or pipe it through head/tail.",
}
"""What a truncation note tells the model to do, per tool."""
DEFAULT_HINT = "Ask for less output: a narrower path or pattern, or a line range."


@dataclass(slots=True)
class CallOutcome:
    call: ToolCall | CallRejected
    result: ToolResult
    submitted_at: float  # time.perf_counter() when submitted
    started_at: float  # when the tool itself began (after waiting for conflicts)
    finished_at: float

    @property
    def duration_ms(self) -> float:
        return (self.finished_at - self.started_at) * 1000.0

    @property
    def name(self) -> str | None:
        return self.call.name


OnResult = Callable[[CallOutcome], Awaitable[None]]


class Executor:
    """One executor per model step. Not thread-safe; use from one event loop."""

    def __init__(self, tools: Mapping[str, Tool], ctx: ToolContext, *, on_result: OnResult | None = None):
        self._tools = tools
        self._ctx = ctx
        self._on_result = on_result
        self._pending: list[tuple[Resources, asyncio.Task[CallOutcome]]] = []
        self._tasks: dict[int, asyncio.Task[CallOutcome]] = {}
        self._calls: dict[int, ToolCall | CallRejected] = {}
        self._outcomes: dict[int, CallOutcome] = {}  # set the moment a tool has finished

    def submit(self, call: ToolCall | CallRejected) -> asyncio.Task[CallOutcome]:
        """Start ``call`` now (after any conflicting earlier call). Never raises."""
        submitted = time.perf_counter()
        if isinstance(call, CallRejected):
            deps: list[asyncio.Task[CallOutcome]] = []
            resources = Resources()
        else:
            tool = self._tools[call.name]
            try:
                resources = tool.resources(call.args)
            except ToolError:
                resources = Resources()  # the tool will report the bad argument itself
            deps = [t for r, t in self._pending if r.conflicts_with(resources)]
        task = asyncio.create_task(self._run(call, deps, submitted, resources), name=f"tool:{call.call_id}")
        self._pending.append((resources, task))
        self._tasks[call.index] = task
        self._calls[call.index] = call
        return task

    async def _run(
        self, call: ToolCall | CallRejected, deps: list[asyncio.Task[CallOutcome]], submitted: float,
        resources: Resources,
    ) -> CallOutcome:
        if deps:
            await asyncio.wait(deps)
        started = time.perf_counter()
        if isinstance(call, CallRejected):
            result = ToolResult.error(call.message)
        else:
            result = await self._invoke(call)
        name = call.name or "the call"
        result = _relative(result, self._host_roots()).capped(name, MORE_HINTS.get(name, DEFAULT_HINT))
        self._ctx.after_call(resources, result)  # the search index learns of edits before anyone reads them
        outcome = CallOutcome(call, result, submitted, started, time.perf_counter())
        self._outcomes[call.index] = outcome  # from here on, cancel() lets it report
        if self._on_result is not None:
            await self._on_result(outcome)
        return outcome

    async def _invoke(self, call: ToolCall) -> ToolResult:
        tool = self._tools[call.name]
        try:
            return await tool.run(call.args, self._ctx)
        except ToolError as exc:
            return ToolResult.error(str(exc))
        except asyncio.CancelledError:
            raise
        except OSError as exc:  # the reason is the model's to read; the scrub makes the path relative
            where = f": {exc.filename}" if exc.filename else ""
            return ToolResult.error(f"{call.name} failed: {exc.strerror or type(exc).__name__}{where}")
        except Exception as exc:  # a bug in a tool must not kill the session
            log.exception("tool %s failed", call.name)
            return ToolResult.error(f"internal error in {call.name}: {type(exc).__name__}: {exc}")

    def _host_roots(self) -> list[tuple[str, str]]:
        """``(host prefix, replacement)`` pairs, longest first: the workspace root, then its store."""
        ws = self._ctx.workspace
        pairs: list[tuple[str, str]] = []
        root = getattr(ws, "root", None)
        if root is not None:
            pairs.append((str(root), "."))
        store_root = getattr(getattr(ws, "store", None), "root", None)
        if store_root is not None:
            pairs.append((str(store_root), "<workspace store>"))
        return sorted(pairs, key=lambda p: -len(p[0]))

    async def results(self) -> list[CallOutcome]:
        """Wait for every submitted call; outcomes sorted by call index."""
        if not self._tasks:
            return []
        await asyncio.wait(list(self._tasks.values()))
        return [self._tasks[i].result() for i in sorted(self._tasks)]

    async def cancel(self) -> None:
        """Cancel calls that have not finished and wait until every task is done.

        A call whose tool already finished is not cancelled: its result is
        real (a file may have changed) and is reported as it is.
        """
        tasks = [t for i, t in self._tasks.items() if not t.done() and i not in self._outcomes]
        for t in tasks:
            t.cancel()
        pending = [t for t in self._tasks.values() if not t.done()]
        if pending:
            await asyncio.wait(pending)

    def settled(self, cancelled_message: str) -> list[tuple[ToolCall | CallRejected, ToolResult, bool]]:
        """After :meth:`cancel`: ``(call, result, finished)`` for every call in call
        order; calls that did not finish get ``cancelled_message`` as an error."""
        out: list[tuple[ToolCall | CallRejected, ToolResult, bool]] = []
        for index in sorted(self._tasks):
            outcome = self._outcomes.get(index)
            if outcome is not None:
                out.append((self._calls[index], outcome.result, True))
            else:
                out.append((self._calls[index], ToolResult.error(cancelled_message), False))
        return out

    def __len__(self) -> int:
        return len(self._tasks)


def _relative(result: ToolResult, roots: list[tuple[str, str]]) -> ToolResult:
    """``result`` with each host root in its output replaced (``root/x`` becomes ``x``)."""
    out = result.output
    for prefix, repl in roots:
        if prefix and prefix in out:
            out = out.replace(prefix + "/", "" if repl == "." else repl + "/").replace(prefix, repl)
    if out is result.output:
        return result
    return ToolResult(result.ok, out, result.data, result.edits)
