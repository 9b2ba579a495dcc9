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

from agent.events import EVENT_ADAPTER
from agent.text_safety import escape_json_text, inert, json_safe_value
from backend.settings import ClientSettings, SettingsError, load_settings
from backend.transcript import Transcript

BACKOFF_FIRST_S = 0.2
BACKOFF_MAX_S = 5.0
GIVE_UP_S = 60.0
# HTTP statuses a retry cannot fix; the socket's close codes 44xx mirror them.
FATAL = {401: "the server rejected the token", 403: "forbidden", 404: "no such session"}


def demo_policy() -> dict[str, Any]:
    """``--policy demo``: the bundled demo's recorded outputs, streamed gently."""
    script = json.loads((Path(__file__).with_name("demo") / "script.json").read_text())
    return {"kind": "scripted", "outputs": script["outputs"], "chunk_chars": 8, "delay_s": 0.01}


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

    @classmethod
    def from_args(cls, args: argparse.Namespace, client: ClientSettings | None = None) -> ChatConfig:
        """The chat's configuration: flags, else ``client`` (default: FLYWHEEL_SERVER / FLYWHEEL_TOKEN
        read by :class:`backend.settings.ClientSettings`)."""
        if client is None:
            try:
                client = load_settings(ClientSettings)
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
        try:
            policy = demo_policy() if args.policy == "demo" else (
                json.loads(args.policy) if args.policy is not None else {"kind": "openai"})
        except json.JSONDecodeError as exc:
            raise ChatError(f"--policy is not valid JSON: {exc}") from None
        if not isinstance(policy, dict):
            raise ChatError('--policy must be a JSON object, e.g. {"kind": "openai"}')
        workspace = Path(args.workspace).resolve() if args.workspace is not None else None
        return cls(server, token, workspace, args.session, policy, args.json)


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


class StdinLines:
    """Lines of a file descriptor as an asyncio queue; ``None`` marks EOF.

    Pipes and terminals are watched by the event loop (no thread blocks on
    them); regular files and ``/dev/null`` cannot be, and never block, so
    they are read at once.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._loop, self._buf, self._watching = loop, b"", False
        try:
            self._fd = sys.stdin.fileno()
        except (AttributeError, OSError, ValueError):  # no stdin at all
            self._fd = os.open(os.devnull, os.O_RDONLY)

    def start(self) -> None:
        try:
            self._loop.add_reader(self._fd, self._readable)
            self._watching = True
        except (OSError, ValueError):
            while chunk := os.read(self._fd, 1 << 16):
                self._feed(chunk)
            self._feed(b"")

    def stop(self) -> None:
        if self._watching:
            self._loop.remove_reader(self._fd)
            self._watching = False

    def _readable(self) -> None:
        try:
            chunk = os.read(self._fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        self._feed(chunk)

    def _feed(self, chunk: bytes) -> None:
        *lines, self._buf = (self._buf + chunk).split(b"\n")
        if not chunk:
            self.stop()
            lines, self._buf = [self._buf] if self._buf else [], b""
        for line in lines:
            self.queue.put_nowait(line.decode("utf-8", "replace").rstrip("\r"))
        if not chunk:
            self.queue.put_nowait(None)


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
        if t is not None and self._last_type == "user_message" and t.number is None and data.get("text") == t.text:
            t.number = data.get("turn")
        elif t is not None and self._last_type == "turn_end" and t.number is not None and data.get("turn") == t.number:
            t.done.set()

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

    async def _rest(self, method: str, path: str, **kwargs: Any) -> Any:
        if "json" in kwargs:  # ASCII JSON: a lone surrogate in --policy travels as its \u escape, not a crash
            kwargs["content"] = json.dumps(kwargs.pop("json"))
            kwargs["headers"] = {"Content-Type": "application/json"}
        try:
            r = await self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ChatError(f"cannot reach the Flywheel server at {self.cfg.server}: "
                            f"{exc or type(exc).__name__}") from None
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
            info = await self._rest("POST", "/v1/sessions", json={
                "workspace": {"path": str(self.cfg.workspace)}, "policy": self.cfg.policy})
            self.session_id = info["id"]
            note = f"session {self.session_id} (attach again with --session {self.session_id})"
            print(inert(note), file=self.err if self.cfg.json else self.out, flush=True)
            return
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
                    if self._conn_id > 1:
                        self._say(f"reconnected; resuming after seq {self.last_seq}", "33")
                        self._spawn(self._after_reconnect(self._conn_id))
                    self._connected.set()
                    delay, down_since = BACKOFF_FIRST_S, None
                    try:
                        async for raw in ws:
                            self._on_message(raw)
                    except ConnectionClosed:
                        pass
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
        loop = asyncio.get_running_loop()
        lines = StdinLines(loop)
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not on Windows
            loop.add_signal_handler(signal.SIGINT, self._on_sigint)
        try:
            await self._open_session()
            self._conn = asyncio.create_task(self._connection_loop())
            await self._until(self._connected.wait())
            lines.start()
            while True:
                if self.interactive:
                    self.out.write("you › ")
                    self.out.flush()
                line = await self._until(lines.queue.get())
                if line is None or line.strip() == "/quit":
                    return 0
                if not line.strip():
                    continue
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
            tasks = [task for task in (self._conn, *self._tasks) if task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._http.aclose()


def run_chat(args: argparse.Namespace) -> int:
    """Entry point of ``flywheel chat``; returns the exit status."""
    try:
        cfg = ChatConfig.from_args(args)

        async def main() -> int:
            return await ChatClient(cfg).run()

        return asyncio.run(main())
    except ChatError as exc:
        print(inert(f"flywheel chat: {exc}"), file=sys.stderr)
        return 1
