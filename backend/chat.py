"""``flywheel chat``: the terminal client of the WebSocket protocol.

It creates a session (REST ``POST /v1/sessions``) or attaches to one (its
history is shown first), sends one user message per input line and shows the
events live with :class:`backend.transcript.Transcript` (``--json``: as JSON
lines). The next line is read only after this turn's ``turn_end``, so piped
input runs turn by turn. When the socket closes without the user asking
(network loss, server restart, 4408 "too slow"), it reconnects with backoff
and resumes with ``?after=<last seq shown>``: no event is shown twice.

Not guaranteed:

* a line sent just as the connection dropped is re-sent only if the log does
  not show it after the reconnect; if the server had it but had not recorded
  it yet, the re-send is refused (409) and the client moves on;
* "a turn is already running" (409) just after this client saw a
  ``turn_end`` is retried for up to ~3 s, since the server may still be
  closing that turn; after that the line is dropped with the error shown;
* a turn in flight when the server died is not resumed: the restarted server
  ends it with ``turn_end`` reason ``shutdown``;
* Ctrl-C asks the server to interrupt; what is already done stays done;
* notices go to stderr, the transcript to stdout: on a terminal they
  interleave only approximately.

Lines that start with ``/`` are commands (``/help`` lists them; ``//text`` sends
``/text``): ``/diff`` shows the session's changes, ``/apply`` applies them to the
session's original directory on this machine (refusing, with nothing written, if a file
they touch changed there since the session started or since the last ``/apply``),
``/undo`` puts the workspace back to how it was before the last message this client
sent (and tells the model with the next one), ``/model [NAME]`` shows the model or
continues in a branch with another one. When the chat ends (``/quit``, EOF), the
session's changes are shown with the choice to apply them, export a patch or leave
them (``--apply``/``--yes``, ``--export-patch``, ``--discard``; off a terminal it only
says how), as :mod:`backend.review` does for ``flywheel run``.

Approvals: in a session whose approval mode asks (``--approval-mode``, or the
session's own when attaching), each ``approval_requested`` is asked on the
terminal (:mod:`backend.terminal_input`: the full command or the edit; ``y``
allows, ``n [reason]`` denies) and the answer is sent as an ``approval``
message; ``--yes`` approves them all. Without a terminal on stdin and without
``--yes`` such a chat refuses to start (nobody could answer). A question is
withdrawn when the request is settled otherwise (another client answered, the
turn ended).

Not guaranteed (commands): ``/undo`` needs the server's checkpoint routes
(``backend/api/routes/changes.py``), covers only turns this client started, cannot
take back what ``/apply`` already wrote, and a restarted server forgets its
checkpoints; ``/model`` re-executes the session's recorded steps in a branch (commands
run again) and the chat continues in the branch.

Everything the server sends is untrusted: the transcript, server messages
and error details pass through :func:`agent.text_safety.inert` before they
are printed, so escape sequences show as text (``^[]52;c;…``) instead of
acting on the terminal. ``--json`` prints exact JSON whose DEL, C1 and bidi
controls are ``\\uXXXX`` escapes; text the server sent as lone-surrogate
escapes is made UTF-8-safe as events are (``agent.text_safety``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit, urlunsplit

import httpx
from pydantic import ValidationError
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from agent.approval import ApprovalRequest, Approver
from agent.events import EVENT_ADAPTER
from agent.text_safety import escape_json_text, inert, json_safe_value
from backend.apply_back import ApplyError, ChangeSet, FileState
from backend.policies import demo_policy
from backend.review import Choice, finish
from backend.review import end_choice as choice_of
from backend.settings import ClientSettings, SettingsError, load_settings
from backend.terminal_input import YES, StdinLines, TerminalApprover, check_can_ask
from backend.transcript import Transcript

BACKOFF_FIRST_S = 0.2
BACKOFF_MAX_S = 5.0
GIVE_UP_S = 60.0
# HTTP statuses a retry cannot fix; the socket's close codes 44xx mirror them.
FATAL = {401: "the server rejected the token", 403: "forbidden", 404: "no such session"}


HELP = """commands:
  /diff           the session's changes so far
  /apply          apply them to the session's directory on this machine (refused if files there changed)
  /undo           put the workspace back to before your last message (the model is told)
  /model [NAME]   show the model, or continue with NAME in a branch of this session
  /help           this list
  /quit           end the chat (then: apply, export a patch, or leave the changes)
  //text          send "/text" as a message"""


def policy_config(value: str | dict[str, Any] | None) -> dict[str, Any]:
    """A session's policy from ``--policy`` or the config file's ``policy``: a JSON object,
    ``demo``, ``openai`` / ``openai:MODEL`` or ``scripted:FILE.json``."""
    if value is None:
        return {"kind": "openai"}
    if isinstance(value, dict):
        return value
    if value == "demo":
        return demo_policy()
    kind, sep, arg = value.partition(":")
    if kind == "openai":
        return {"kind": "openai", "model": arg} if arg else {"kind": "openai"}
    if kind == "scripted" and sep:
        from agent.policies.scripted import load_outputs
        from agent.policy import PolicyError

        try:
            return {"kind": "scripted", "outputs": load_outputs(arg)}
        except PolicyError as exc:
            raise ChatError(str(exc)) from None
    try:
        policy = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ChatError(f"--policy is not valid JSON ({exc}), nor demo, openai[:MODEL] or scripted:FILE") from None
    if not isinstance(policy, dict):
        raise ChatError('--policy must be a JSON object, e.g. {"kind": "openai"}')
    return policy


class ChatError(Exception):
    """A user-facing failure: printed without a traceback, exit status 1."""


class _Quit(Exception):
    """The user quit; ``args[0]`` is the exit status."""


@dataclass(frozen=True)
class ChatConfig:
    server: str
    token: str
    workspace: Path | None = None
    session: str | None = None
    policy: dict[str, Any] = field(default_factory=lambda: {"kind": "openai"})
    json: bool = False
    give_up_s: float = GIVE_UP_S  # reconnecting stops after this long without a connection
    end_choice: Choice = "ask"  # what to do with the changes when the chat ends
    export_patch: Path | None = None
    approval_mode: str = "auto"  # sent with a new session; the server enforces it
    yes: bool = False  # --yes: approve every call the session's approval mode asks about

    @classmethod
    def from_args(cls, args: argparse.Namespace, client: ClientSettings | None = None) -> ChatConfig:
        """The chat's configuration: flags, else ``client`` (default: FLYWHEEL_SERVER / FLYWHEEL_TOKEN
        read by :class:`backend.settings.ClientSettings`)."""
        if client is None:
            try:
                client = load_settings(ClientSettings, approval_mode=getattr(args, "approval_mode", None))
            except SettingsError as exc:
                raise ChatError(str(exc)) from None
        token = args.token or client.token
        if not token:
            raise ChatError("no token: pass --token or set FLYWHEEL_TOKEN (`flywheel serve` prints one)")
        server = (args.server or client.server).rstrip("/")
        if urlsplit(server).scheme not in ("http", "https"):
            raise ChatError(f"--server must be an http:// or https:// URL, not {server!r}")
        if (args.workspace is None) == (args.session is None):
            raise ChatError("give --workspace PATH to start a session or --session ID to attach to one")
        policy = policy_config(args.policy if args.policy is not None else client.policy)
        workspace = Path(args.workspace).resolve() if args.workspace is not None else None
        return cls(server, token, workspace, args.session, policy, args.json, end_choice=choice_of(args),
                   export_patch=getattr(args, "export_patch", None), approval_mode=client.approval_mode,
                   yes=bool(getattr(args, "yes", False)))


@dataclass
class _Turn:
    """A user line on its way: sent, then echoed as ``user_message`` (which
    tells its turn number), then ended by that turn's ``turn_end``."""

    text: str
    after: int  # the last seq shown when it was sent
    done: asyncio.Event = field(default_factory=asyncio.Event)
    number: int | None = None
    sent_on: int = 0  # which connection carried it (0: not sent yet)
    interrupting: bool = False
    retries: int = 0


class ChatClient:
    def __init__(self, cfg: ChatConfig, out: TextIO | None = None, err: TextIO | None = None):
        self.cfg, self.out, self.err = cfg, out or sys.stdout, err or sys.stderr
        self.transcript = Transcript(self.out)
        self.interactive = sys.stdin is not None and sys.stdin.isatty() and not cfg.json
        self.last_seq = 0
        self._last_type = ""
        self.session_id = cfg.session or ""
        self._turn: _Turn | None = None
        self._ws: ClientConnection | None = None
        self._conn_id = 0
        self._connected = asyncio.Event()
        self._conn: asyncio.Task[None] | None = None
        self._quit: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._http = httpx.AsyncClient(base_url=cfg.server, headers={"Authorization": f"Bearer {cfg.token}"},
                                       timeout=10.0)
        self.steps = 0  # model calls seen (a /model branch re-executes this many)
        self.original: Path | None = cfg.workspace  # the directory /apply writes to
        self.applied: dict[str, FileState | None] = {}  # what /apply wrote, per path
        self.end: ChangeSet | None = None  # the changes when the chat ended (for the review)
        self.end_diff = ""  # and their diff as the server shows it
        self._checkpoints: list[str] = []  # snapshot ids, one before each message this client sent
        self._undo_ok = True  # False once the server answered that it has no checkpoint routes
        self._note = ""  # said to the model with the next message (after an /undo)
        self._switching = False  # the socket is closed on purpose: reconnect at once, quietly
        # Approvals: each open approval_requested is asked (or, with --yes, approved) by a task;
        # stdin lines go to an open question first, else to the prompt loop (_input).
        self.can_ask = sys.stdin is not None and sys.stdin.isatty()
        self.approver: Approver = YES if cfg.yes else TerminalApprover(self._read_answer,
                                                                      self.err if cfg.json else self.out)
        self._asking: dict[str, asyncio.Task[None]] = {}  # call id -> the task answering it
        self._answer_waiters: list[asyncio.Future[str | None]] = []
        self._input: asyncio.Queue[str | None] = asyncio.Queue()

    def _say(self, text: str, style: str = "2") -> None:
        color = self.err.isatty() and "NO_COLOR" not in os.environ
        text = inert(text)  # server messages are untrusted; colour is added after
        self.err.write((f"\x1b[{style}m{text}\x1b[0m" if color else text) + "\n")
        self.err.flush()

    def _show(self, data: dict[str, Any]) -> None:
        if self.cfg.json:
            line = json.dumps(json_safe_value(data), ensure_ascii=False, separators=(",", ":"))
            self.out.write(escape_json_text(line) + "\n")
            self.out.flush()
            return
        t = self._turn
        if (self.interactive and t is not None and t.number is None and data.get("type") == "user_message"
                and data.get("text") == t.text):
            return  # the user just typed it
        try:
            event = EVENT_ADAPTER.validate_python(data)
        except ValidationError:
            return  # a type this client does not know: ignore it (docs/protocol.md)
        self.transcript(event)

    def _on_event(self, data: dict[str, Any]) -> None:
        seq = data.get("seq")
        if not isinstance(seq, int) or seq <= self.last_seq:
            return  # already shown (a resumed backlog overlaps) or not an event
        self._show(data)
        t, self.last_seq, self._last_type = self._turn, seq, str(data.get("type"))
        self.steps += self._last_type == "assistant_message"
        self._track_approval(data)
        if t is not None and self._last_type == "user_message" and t.number is None and data.get("text") == t.text:
            t.number = data.get("turn")
        elif t is not None and self._last_type == "turn_end" and t.number is not None and data.get("turn") == t.number:
            t.done.set()

    # -- approvals ---------------------------------------------------------------------

    def _track_approval(self, data: dict[str, Any]) -> None:
        """Ask about each approval request that is open; stop asking once it is settled
        (answered here or by another client, its call cancelled, its turn ended)."""
        kind, call_id = data.get("type"), data.get("call_id")
        if kind == "approval_requested" and isinstance(call_id, str) and call_id not in self._asking:
            request = ApprovalRequest(call_id, str(data.get("name") or ""), dict(data.get("args") or {}),
                                      "command" if data.get("kind") == "command" else "edit",
                                      int(data.get("step") or 0), int(data.get("index") or 0))
            task = asyncio.ensure_future(self._answer(request))
            self._asking[call_id] = task
            task.add_done_callback(lambda _t, c=call_id: self._asking.pop(c, None))
        elif kind in ("approval_resolved", "tool_result") and isinstance(call_id, str):
            if (task := self._asking.get(call_id)) is not None:
                task.cancel()
        elif kind == "turn_end":
            for task in list(self._asking.values()):
                task.cancel()

    async def _answer(self, request: ApprovalRequest) -> None:
        decision = await self.approver.decide(request)
        msg = {"type": "approval", "call_id": request.call_id, "approved": decision.approved,
               "reason": decision.reason[:2000]}
        while True:  # the answer must reach the server: after a reconnect the request is still open there
            await self._connected.wait()
            if (ws := self._ws) is None:
                await asyncio.sleep(0.05)
                continue
            try:
                await ws.send(json.dumps(msg))
                return
            except ConnectionClosed:
                await asyncio.sleep(0.05)

    async def _read_answer(self) -> str | None:
        """The next stdin line, for an open approval question."""
        waiter: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._answer_waiters.append(waiter)
        try:
            return await waiter
        finally:
            self._answer_waiters.remove(waiter)

    async def _route_lines(self, lines: StdinLines) -> None:
        """Stdin lines: to the open approval question, if any, else to the prompt loop."""
        while True:
            line = await lines.queue.get()
            waiter = next((w for w in self._answer_waiters if not w.done()), None)
            if waiter is not None:
                waiter.set_result(line)
                if line is not None:
                    continue
            self._input.put_nowait(line)
            if line is None:
                return

    def _check_can_ask(self, mode: object) -> None:
        why = check_can_ask(str(mode or "auto"), interactive=self.can_ask, yes=self.cfg.yes, command="flywheel chat")
        if why is not None:
            raise ChatError(why)

    def _on_message(self, raw: str | bytes) -> None:
        try:
            data = json.loads(raw)
        except ValueError:
            return
        if isinstance(data, dict) and data.get("type") == "request_error":
            t = self._turn
            if (t is not None and t.number is None and data.get("status") == 409 and t.retries < 10
                    and "already running" in str(data.get("message")) and self._last_type == "turn_end"):
                # Right after a turn_end the server may still be closing that turn
                # and answer 409 for a moment: no turn is running that we know of, so retry.
                t.retries += 1
                self._spawn(self._resend_later(t, 0.05 * t.retries))
                return
            self._say(f"server: {data.get('message', data)}", "31")
            if t is not None and t.number is None:
                t.done.set()  # the line was refused; no turn will run for it
        elif isinstance(data, dict):
            self._on_event(data)

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One HTTP request; an unreachable server is a :class:`ChatError`."""
        if "json" in kwargs:  # ASCII JSON: a lone surrogate in --policy travels as its \u escape, not a crash
            kwargs["content"] = json.dumps(kwargs.pop("json"))
            kwargs["headers"] = {"Content-Type": "application/json"}
        try:
            return await self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ChatError(f"cannot reach the Flywheel server at {self.cfg.server}: "
                            f"{exc or type(exc).__name__}") from None

    async def _rest(self, method: str, path: str, **kwargs: Any) -> Any:
        r = await self._request(method, path, **kwargs)
        if r.status_code < 400:
            return r.json()
        try:
            detail = r.json().get("detail")
        except (ValueError, AttributeError):
            detail = r.text
        detail = detail if isinstance(detail, str) else json.dumps(detail)[:300]
        hint = "; pass --token or set FLYWHEEL_TOKEN" if r.status_code == 401 else ""
        raise ChatError(f"{FATAL.get(r.status_code, 'the server refused')} (HTTP {r.status_code}: {detail}){hint}")

    async def _open_session(self) -> None:
        if self.cfg.session is None:
            self._check_can_ask(self.cfg.approval_mode)  # before anything is created
            body: dict[str, Any] = {"workspace": {"path": str(self.cfg.workspace)}, "policy": self.cfg.policy}
            if self.cfg.approval_mode != "auto":
                body["approval_mode"] = self.cfg.approval_mode
            info = await self._rest("POST", "/v1/sessions", json=body)
            self.session_id = info["id"]
            note = f"session {self.session_id} (attach again with --session {self.session_id})"
            print(inert(note), file=self.err if self.cfg.json else self.out, flush=True)
            return
        info = await self._rest("GET", f"/v1/sessions/{self.session_id}")
        source = info.get("source") if isinstance(info.get("source"), dict) else {}
        self._check_can_ask(source.get("approval_mode"))
        if isinstance(source.get("path"), str):
            self.original = Path(source["path"])
        after, more = 0, True
        while more:  # the history, before the first prompt
            page = await self._rest("GET", f"/v1/sessions/{self.session_id}/events",
                                    params={"after": after, "limit": 1000})
            for data in page["events"]:
                self._on_event(data)
            after, more = page["next_after"], page["more"]

    def _ws_url(self) -> str:
        u = urlsplit(self.cfg.server)
        return urlunsplit(("wss" if u.scheme == "https" else "ws", u.netloc,
                           f"{u.path}/v1/sessions/{self.session_id}/ws", f"after={self.last_seq}", ""))

    async def _connection_loop(self) -> None:
        """Keep one socket open; reconnect with backoff until the user quits."""
        delay, down_since = BACKOFF_FIRST_S, None
        while True:
            why = ""
            try:
                async with connect(self._ws_url(), additional_headers={"Authorization": f"Bearer {self.cfg.token}"},
                                   open_timeout=5, close_timeout=2, max_size=1 << 26) as ws:
                    self._ws, self._conn_id = ws, self._conn_id + 1
                    if self._conn_id > 1 and not self._switching:
                        self._say(f"reconnected; resuming after seq {self.last_seq}", "33")
                        self._spawn(self._after_reconnect(self._conn_id))
                    self._switching = False
                    self._connected.set()
                    delay, down_since = BACKOFF_FIRST_S, None
                    try:
                        async for raw in ws:
                            self._on_message(raw)
                    except ConnectionClosed:
                        pass
                    if self._switching:
                        continue  # to another session (/model): connect to it at once
                    code, reason = ws.close_code or 1006, ws.close_reason or ""
                    if code - 4000 in FATAL:
                        raise ChatError(f"{FATAL[code - 4000]} ({reason or 'close code'} {code})")
                    why = f"closed with code {code}" + (f": {reason}" if reason else "")
            except InvalidStatus as exc:
                status = exc.response.status_code
                if status in FATAL:  # the server refuses before accepting, so the close code is lost:
                    await self._rest("GET", f"/v1/sessions/{self.session_id}")  # REST says why, if it can
                    raise ChatError(f"{FATAL[status]}: the server refused the WebSocket (HTTP {status})") from None
                why = f"HTTP {status}"
            except InvalidURI as exc:
                raise ChatError(f"bad server URL: {exc}") from None
            except (OSError, TimeoutError, InvalidHandshake) as exc:
                why = str(exc) or type(exc).__name__
            finally:
                self._ws = None
                self._connected.clear()
            now = time.monotonic()
            down_since = down_since or now
            if now - down_since > self.cfg.give_up_s:
                raise ChatError(f"lost the connection to {self.cfg.server} and could not reconnect for "
                                f"{self.cfg.give_up_s:.0f} s ({why}); attach again with --session {self.session_id}")
            self._say(f"connection lost ({why}); reconnecting in {delay:.1f} s", "33")
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)

    async def _after_reconnect(self, conn_id: int) -> None:
        """Re-send what the dropped connection may have lost."""
        t = self._turn
        if t is None:
            return
        if t.number is None and t.sent_on != conn_id:
            try:
                page = await self._rest("GET", f"/v1/sessions/{self.session_id}/events",
                                        params={"after": t.after, "limit": 5000})
            except ChatError as exc:
                self._say(f"could not check whether the message arrived: {exc}", "33")
                return
            if t.number is None and not any(e.get("type") == "user_message" and e.get("text") == t.text
                                            for e in page["events"]):
                await self._send_line(t)
        if t.interrupting and self._turn is t:
            await self._send_now({"type": "interrupt"})

    async def _send_now(self, msg: dict[str, Any]) -> None:
        """Send if connected; otherwise the reconnect re-sends what matters."""
        if (ws := self._ws) is not None:
            with contextlib.suppress(ConnectionClosed):
                await ws.send(json.dumps(msg))

    async def _send_line(self, t: _Turn) -> None:
        t.sent_on = self._conn_id
        await self._send_now({"type": "user_message", "text": t.text})

    async def _resend_later(self, t: _Turn, delay: float) -> None:
        await asyncio.sleep(delay)
        if self._turn is t and t.number is None:
            await self._send_line(t)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _until(self, aw: Any) -> Any:
        """Await ``aw`` unless the user quits or the connection fails for good."""
        task = asyncio.ensure_future(aw)
        others: set[asyncio.Future[Any]] = {self._quit}
        if self._conn is not None:
            others.add(self._conn)
        await asyncio.wait({task, *others}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        if self._quit.done():
            raise _Quit(self._quit.result())
        assert self._conn is not None
        self._conn.result()  # raises its ChatError
        raise ChatError("the connection ended")

    def _on_sigint(self) -> None:
        t = self._turn
        if t is None or t.done.is_set() or t.interrupting:  # at the prompt, or a second Ctrl-C
            if not self._quit.done():
                self._quit.set_result(0 if t is None or t.done.is_set() else 130)
            return
        t.interrupting = True
        self._say("\ninterrupting the turn… (Ctrl-C again to quit)", "33")
        self._spawn(self._send_now({"type": "interrupt"}))

    async def run(self) -> int:
        """Chat until the user quits; then (status 0) keep the session's changes in :attr:`end`."""
        try:
            status = await self._chat()
            if status == 0 and self.session_id:
                try:
                    self.end = await self._changes()
                    if self.end and not self.cfg.json:
                        page = await self._rest("GET", f"/v1/sessions/{self.session_id}/diff", timeout=120.0)
                        self.end_diff = str(page.get("diff") or "")
                except ChatError as exc:
                    self._say(f"could not fetch the session's changes: {exc}", "33")
            return status
        finally:
            await self._http.aclose()

    async def _chat(self) -> int:
        loop = asyncio.get_running_loop()
        lines = StdinLines(loop)
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not on Windows
            loop.add_signal_handler(signal.SIGINT, self._on_sigint)
        try:
            await self._open_session()
            self._conn = asyncio.create_task(self._connection_loop())
            await self._until(self._connected.wait())
            lines.start()
            self._spawn(self._route_lines(lines))
            while True:
                if self.interactive:
                    self.out.write("you › ")
                    self.out.flush()
                line = await self._until(self._input.get())
                if line is None or line.strip() == "/quit":
                    return 0
                if not line.strip():
                    continue
                if line.startswith("/") and not line.startswith("//"):
                    await self._until(self._command(line.strip()))
                    continue
                if line.startswith("//"):
                    line = line[1:]
                await self._until(self._checkpoint())
                if self._note:
                    line, self._note = self._note + line, ""
                t = self._turn = _Turn(text=line, after=self.last_seq)
                await self._until(self._connected.wait())
                await self._send_line(t)
                await self._until(t.done.wait())
                self._turn = None
        except _Quit as q:
            if self.interactive:
                self.out.write("\n")
            return int(q.args[0])
        finally:
            lines.stop()
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGINT)
            tasks = [task for task in (self._conn, *self._tasks, *self._asking.values()) if task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- commands (at the prompt, never during a turn) ---------------------------------

    async def _command(self, line: str) -> None:
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        if name == "/help":
            self._print(HELP)
        elif name == "/diff":
            await self._show_diff()
        elif name == "/apply":
            await self._apply()
        elif name == "/undo":
            await self._undo()
        elif name == "/model":
            await self._model(arg)
        else:
            self._say(f"unknown command {name} (/help lists them; //text sends /text)", "33")

    def _print(self, text: str) -> None:
        target = self.err if self.cfg.json else self.out
        target.write(inert(text) + ("" if text.endswith("\n") else "\n"))
        target.flush()

    async def _try(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        """Like :meth:`_rest`, but a refusal is returned as ``(status, detail)`` instead of raised."""
        r = await self._request(method, path, **kwargs)
        try:
            body = r.json()
        except ValueError:
            body = r.text
        if r.status_code >= 400 and isinstance(body, dict):
            body = body.get("detail", body)
        return r.status_code, body

    async def _changes(self) -> ChangeSet | None:
        """The session's changes (None if this server cannot send them)."""
        code, body = await self._try("GET", f"/v1/sessions/{self.session_id}/changes", timeout=120.0)
        if code == 404 and not str(body).startswith("no session"):
            self._say("this server does not send a session's changes (no /changes route); "
                      "use `flywheel sessions diff` on the server's machine", "33")
            return None
        if code >= 400:
            raise ChatError(f"the server refused (HTTP {code}: {body})")
        try:
            return ChangeSet.from_json(body)
        except ApplyError as exc:
            raise ChatError(str(exc)) from None

    async def _show_diff(self) -> None:
        page = await self._rest("GET", f"/v1/sessions/{self.session_id}/diff", timeout=120.0)
        diff = str(page.get("diff") or "")
        self._print(diff if diff else "no changes yet")

    async def _apply(self) -> None:
        changes = await self._changes()
        if changes is None:
            return
        target, why = self.apply_target()
        if not changes:
            self._print("no changes to apply")
            return
        outcome = finish(changes, target, choice="apply", say=self.err if self.cfg.json else self.out,
                         no_target=why, expected=self.applied)
        if outcome.status == 0:
            self.applied.update({c.path: c.new for c in changes.changes})

    def apply_target(self) -> tuple[Path | None, str]:
        """The session's original directory on this machine, or None and why not."""
        if self.original is None:
            return None, "the session's original directory is not known"
        if not self.original.is_dir():
            return None, f"the session's directory {self.original} is not on this machine"
        return self.original, ""

    async def _checkpoint(self) -> None:
        """Snapshot the workspace before a message, so /undo can put it back."""
        if not self._undo_ok:
            return
        code, body = await self._try("POST", f"/v1/sessions/{self.session_id}/checkpoints", timeout=120.0)
        if code == 404 and not str(body).startswith("no session"):
            self._undo_ok = False  # an older server: /undo will say so
        elif code < 400 and isinstance(body, dict) and isinstance(body.get("snapshot"), str):
            self._checkpoints.append(body["snapshot"])

    async def _undo(self) -> None:
        if not self._undo_ok:
            self._say("this server has no checkpoints, so /undo cannot work with it", "33")
            return
        if not self._checkpoints:
            self._say("nothing to undo (no message sent from this chat yet)", "33")
            return
        code, body = await self._try("POST", f"/v1/sessions/{self.session_id}/restore",
                                     json={"snapshot": self._checkpoints[-1]}, timeout=120.0)
        if code >= 400:
            self._say(f"cannot undo: {body} (HTTP {code})", "31")
            return
        self._checkpoints.pop()
        restored = [str(p) for p in body.get("restored", [])]
        if not restored:
            self._print("the last turn changed no files; nothing to undo")
            return
        shown = ", ".join(restored[:10]) + (f" and {len(restored) - 10} more" if len(restored) > 10 else "")
        self._print(f"undid the last turn's changes to {len(restored)} file(s): {shown} "
                    "(the model is told with your next message)")
        self._note = (f"[The user undid the changes of your previous turn; these files are back as they were "
                      f"before it: {shown}.]\n\n")
        if any(p in {c for c in map(_display, self.applied)} for p in restored):
            self._say("note: /apply already wrote some of these files to your directory; /undo does not take "
                      "them back there (run /apply again to write the workspace's state)", "33")

    async def _model(self, name: str) -> None:
        info = await self._rest("GET", f"/v1/sessions/{self.session_id}")
        policy = info.get("policy") if isinstance(info.get("policy"), dict) else {}
        kind = policy.get("kind")
        if not name:
            what = f"openai, model {policy.get('model')!r}" if kind == "openai" else str(kind)
            self._print(f"model: {what}")
            return
        if kind != "openai":
            self._say(f"this session's policy is {kind!r}; /model switches the model of an openai session", "33")
            return
        new_policy = {"kind": "openai", "model": name, "temperature": policy.get("temperature", 0.0)}
        self._print(f"continuing with {name!r} in a branch of this session (its {self.steps} model call(s) are "
                    "re-executed on a fresh copy of the starting workspace)…")
        new = await self._rest("POST", f"/v1/sessions/{self.session_id}/branch", timeout=600.0,
                               json={"from_step": self.steps, "policy": new_policy, "auto_continue": False})
        fresh = await self._rest("GET", f"/v1/sessions/{new['id']}")
        old, self.session_id = self.session_id, str(new["id"])
        self.last_seq, self._checkpoints = int(fresh.get("last_seq", 0)), []
        conn = self._conn_id
        self._switching = True
        if (ws := self._ws) is not None:
            await ws.close()
        while self._conn_id == conn:
            await asyncio.sleep(0.02)
        self._print(f"now in session {self.session_id} with model {name!r} (attach with --session "
                    f"{self.session_id}); session {old} is unchanged")


def _display(path: str) -> str:
    from tools.paths import display_path

    return display_path(path)


def review(client: ChatClient, *, ask: Any = None) -> int:
    """The end of a chat: show the session's changes, then apply / export / leave them
    (:func:`backend.review.finish`). ``ask`` reads an answer (None: not interactive)."""
    changes = client.end
    if changes is None:
        return 0
    cfg = client.cfg
    say = client.err if cfg.json else client.out
    if not changes:
        return 0
    if not cfg.json:
        diff = client.end_diff
        say.write(inert(f"\nthe session's changes ({changes.summary()}):\n{diff}"
                        + ("" if diff.endswith("\n") else "\n")))
        say.flush()
    target, why = client.apply_target()
    sid = client.session_id
    return finish(changes, target, choice=cfg.end_choice, say=say, patch_file=cfg.export_patch, ask=ask,
                  no_target=why, expected=client.applied,
                  retry_hint=f"attach again to apply them: flywheel chat --session {sid} --apply < /dev/null",
                  discarded=f"nothing was written to your directory, but session {sid} keeps them in its workspace on "
                  f"the server (`flywheel chat --session {sid} --apply` applies them later)").status


def _ask(prompt: str) -> str | None:
    try:
        return input(prompt)
    except EOFError:
        return None


def run_chat(args: argparse.Namespace) -> int:
    """Entry point of ``flywheel chat``; returns the exit status."""
    try:
        cfg = ChatConfig.from_args(args)
        clients: list[ChatClient] = []

        async def main() -> int:
            clients.append(ChatClient(cfg))
            return await clients[0].run()

        status = asyncio.run(main())
    except ChatError as exc:
        print(inert(f"flywheel chat: {exc}"), file=sys.stderr)
        return 1
    interactive = not cfg.json and sys.stdin is not None and sys.stdin.isatty() and sys.stdout.isatty()
    return max(status, review(clients[0], ask=_ask if interactive else None))
