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

What a caller can watch (:class:`CallHooks`, optional): before a call runs
it may be held for the user's approval (``approve``; a refusal becomes the
call's result and the tool never runs); a call that must wait for earlier
calls is reported as ``queued`` with their ids; ``running`` marks the moment
its tool begins; ``output`` receives what a running tool prints
(:mod:`tools.progress`); ``finished`` is awaited after the tool ends and
before its result is reported, so a caller can flush what it shows live. A
call cancelled while running keeps how long it ran and the output it had
printed (:meth:`Executor.settled`).

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
from typing import NamedTuple, Protocol

from agent.calls import CallRejected, ToolCall
from tools.base import Resources, Tool, ToolContext, ToolError, ToolResult
from tools.progress import listening

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

PARTIAL_OUTPUT_CHARS = 32 << 10
"""How much of a running call's output is kept for its result if it is cancelled (head and tail, each half)."""


class CallHooks(Protocol):
    """What the session is told about each valid call, in this order per call:
    ``approve`` → (``queued``) → ``running`` → ``output``… → ``finished`` → the
    result. A call cancelled on the way gets none of the later ones."""

    async def approve(self, call: ToolCall, resources: Resources) -> ToolResult | None:
        """None: go ahead. A result: the call is refused with it (the tool does not run)."""
        ...

    async def queued(self, call: ToolCall, waiting_for: list[str]) -> None:
        """The call waits for these earlier calls (ids) before it may start."""
        ...

    async def running(self, call: ToolCall) -> None:
        """The tool begins now (called for every call that runs)."""
        ...

    def output(self, call: ToolCall, text: str) -> None:
        """Text the running tool printed (on the loop; must not block)."""
        ...

    async def finished(self, call: ToolCall) -> None:
        """The tool returned; its result is reported after this returns."""
        ...


class Settled(NamedTuple):
    """One call after :meth:`Executor.cancel`: its result, whether its tool
    finished, and how long the tool ran (0 if it never started)."""

    call: ToolCall | CallRejected
    result: ToolResult
    finished: bool
    duration_ms: float


class _Partial:
    """A running call's output as it came: the first and last ``cap // 2`` characters."""

    def __init__(self, cap: int = PARTIAL_OUTPUT_CHARS) -> None:
        self._half = cap // 2
        self._head: list[str] = []
        self._head_len = 0
        self._tail = ""
        self.dropped = 0

    def feed(self, text: str) -> None:
        room = self._half - self._head_len
        if room > 0:
            self._head.append(text[:room])
            self._head_len += min(room, len(text))
            text = text[room:]
        if text:
            tail = self._tail + text
            self.dropped += max(0, len(tail) - self._half)
            self._tail = tail[-self._half:] if self._half else ""

    def text(self) -> str:
        head = "".join(self._head)
        if self.dropped:
            return f"{head}\n[... {self.dropped} characters not kept ...]\n{self._tail}"
        return head + self._tail


class Executor:
    """One executor per model step. Not thread-safe; use from one event loop."""

    def __init__(self, tools: Mapping[str, Tool], ctx: ToolContext, *, on_result: OnResult | None = None,
                 hooks: CallHooks | None = None):
        self._tools = tools
        self._ctx = ctx
        self._on_result = on_result
        self._hooks = hooks
        self._pending: list[tuple[Resources, asyncio.Task[CallOutcome], str]] = []
        self._tasks: dict[int, asyncio.Task[CallOutcome]] = {}
        self._calls: dict[int, ToolCall | CallRejected] = {}
        self._outcomes: dict[int, CallOutcome] = {}  # set the moment a tool has finished
        self._state: dict[int, str] = {}  # approval | queued | running, while not finished
        self._started: dict[int, float] = {}
        self._partial: dict[int, _Partial] = {}

    def submit(self, call: ToolCall | CallRejected) -> asyncio.Task[CallOutcome]:
        """Start ``call`` now (after any conflicting earlier call). Never raises."""
        submitted = time.perf_counter()
        if isinstance(call, CallRejected):
            deps: list[tuple[asyncio.Task[CallOutcome], str]] = []
            resources = Resources()
        else:
            tool = self._tools[call.name]
            try:
                resources = tool.resources(call.args)
            except ToolError:
                resources = Resources()  # the tool will report the bad argument itself
            deps = [(t, cid) for r, t, cid in self._pending if r.conflicts_with(resources)]
        task = asyncio.create_task(self._run(call, deps, submitted, resources), name=f"tool:{call.call_id}")
        self._pending.append((resources, task, call.call_id))
        self._tasks[call.index] = task
        self._calls[call.index] = call
        return task

    async def _run(
        self, call: ToolCall | CallRejected, deps: list[tuple[asyncio.Task[CallOutcome], str]], submitted: float,
        resources: Resources,
    ) -> CallOutcome:
        hooks = self._hooks if isinstance(call, ToolCall) else None
        refusal: ToolResult | None = None
        if hooks is not None:
            assert isinstance(call, ToolCall)
            self._state[call.index] = "approval"
            refusal = await hooks.approve(call, resources)
        waiting = [(t, cid) for t, cid in deps if not t.done()] if refusal is None else []
        if waiting:  # a refused call does not wait: it will not touch anything
            self._state[call.index] = "queued"
            if hooks is not None:
                assert isinstance(call, ToolCall)
                await hooks.queued(call, [cid for _, cid in waiting])
            await asyncio.wait([t for t, _ in waiting])
        started = time.perf_counter()
        self._started[call.index] = started
        self._state[call.index] = "running"
        if isinstance(call, CallRejected):
            result = ToolResult.error(call.message)
        elif refusal is not None:
            result = refusal
        else:
            if hooks is not None:
                await hooks.running(call)
            result = await self._invoke(call)
        name = call.name or "the call"
        result = _relative(result, self._host_roots()).capped(name, MORE_HINTS.get(name, DEFAULT_HINT))
        self._ctx.after_call(resources, result)  # the search index learns of edits before anyone reads them
        outcome = CallOutcome(call, result, submitted, started, time.perf_counter())
        self._outcomes[call.index] = outcome  # from here on, cancel() lets it report
        self._partial.pop(call.index, None)
        if hooks is not None:
            assert isinstance(call, ToolCall)
            await hooks.finished(call)
        if self._on_result is not None:
            await self._on_result(outcome)
        return outcome

    async def _invoke(self, call: ToolCall) -> ToolResult:
        tool = self._tools[call.name]
        hooks = self._hooks
        listener = None
        if hooks is not None:
            partial = self._partial[call.index] = _Partial()

            def listener(text: str) -> None:
                partial.feed(text)
                hooks.output(call, text)

        try:
            with listening(listener):
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

    def scrub(self, text: str) -> str:
        """``text`` with the workspace's host locations replaced, as results are."""
        return _relative(ToolResult(True, text), self._host_roots()).output

    def scrub_stream(self, pending: str, *, final: bool) -> tuple[str, str]:
        """Live output, scrubbed like results: ``(text to show, raw text to hold back)``.

        Unless ``final``, the end of ``pending`` that could be the start of a
        host root (cut between two reads) is held back, to be scrubbed once
        the rest of it arrives.
        """
        roots = self._host_roots()
        shown = _relative(ToolResult(True, pending), roots).output
        if final or not roots:
            return shown, ""
        hold = 0
        for prefix, _ in roots:
            for k in range(min(len(prefix) - 1, len(pending)), hold, -1):
                if pending.endswith(prefix[:k]):
                    hold = k
                    break
        if hold and shown.endswith(pending[-hold:]):
            return shown[:-hold], pending[-hold:]
        return shown, ""

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

    def settled(self, cancelled_message: str) -> list[Settled]:
        """After :meth:`cancel`: every call in call order. A call that did not
        finish gets an error result: ``cancelled_message``, then how long its
        tool had run and the output it had printed (head and tail, host paths
        scrubbed, capped like any result), or what it was still waiting for.
        ``data``: ``cancelled`` (true), ``ran_s`` (or ``waited_for``:
        ``approval`` / ``queued``), ``partial_output`` (characters kept, when
        there are any)."""
        out: list[Settled] = []
        now = time.perf_counter()
        for index in sorted(self._tasks):
            call = self._calls[index]
            outcome = self._outcomes.get(index)
            if outcome is not None:
                out.append(Settled(call, outcome.result, True, outcome.duration_ms))
                continue
            started = self._started.get(index)
            state = self._state.get(index, "running")
            if started is None or state != "running":
                waited = "approval" if state == "approval" else "queued"
                why = "the user's approval" if waited == "approval" else "earlier calls to finish"
                result = ToolResult.error(f"{cancelled_message} (it had not started: it was waiting for {why})",
                                          cancelled=True, waited_for=waited)
                out.append(Settled(call, result, False, 0.0))
                continue
            ran = now - started
            partial = self._partial.get(index)
            shown = self.scrub(partial.text()) if partial is not None else ""
            data: dict[str, object] = {"cancelled": True, "ran_s": round(ran, 3)}
            if shown:
                data["partial_output"] = len(shown)
                text = f"{cancelled_message} (after running {ran:.1f} s). Its output so far:\n{shown}"
            else:
                text = f"{cancelled_message} (after running {ran:.1f} s; no output so far)"
            name = call.name or "the call"
            result = ToolResult(False, text, data).capped(name, MORE_HINTS.get(name, DEFAULT_HINT))
            out.append(Settled(call, result, False, round(ran * 1000.0, 3)))
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
