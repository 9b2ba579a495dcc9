"""The browser end-to-end harness: a real ``flywheel serve`` subprocess on a real database, headless
Debian Chromium driven by Playwright's Python API (never a browser download), and a TCP proxy that can
take the server's socket away from the browser mid-turn. ``tests/web`` and ``benchmarks/web_app.py``
use it.

Not guaranteed: Playwright's bundled driver speaks to the Debian Chromium it finds; a Chromium much
older than the Playwright release may refuse some calls (the tests then fail, they do not skip).
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agent.parser import encode_call
from backend.db.engine import make_engine, migrate
from backend.db.log import SessionLog
from backend.server_process import ServerProcess
from tests.backend.conftest import postgres_reachable, postgres_schema

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("FLYWHEEL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
WEB_DIST = REPO / "web" / "dist"
AXE = REPO / "web" / "node_modules" / "axe-core" / "axe.min.js"


def missing() -> str | None:
    """Why the browser tests cannot run here (None: they can)."""
    if not Path(CHROMIUM).exists():
        return f"Chromium is not installed at {CHROMIUM} (Debian: apt-get install chromium)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "the playwright Python package is not installed (scripts/setup.sh --test)"
    if not (WEB_DIST / "index.html").is_file():
        return "the web app is not built (scripts/setup.sh builds web/ into web/dist)"
    if not AXE.is_file():
        return "web/node_modules/axe-core is missing (cd web && npm ci)"
    return None


def launch(playwright: Any) -> Any:
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


@contextmanager
def database(tmp: Path, kind: str = "auto") -> Iterator[str]:
    """A fresh PostgreSQL schema (``kind`` "postgresql", or "auto" when the server is reachable), else
    a SQLite file (the default ``flywheel serve`` setup)."""
    if kind == "sqlite" or (kind == "auto" and not postgres_reachable()):
        yield f"sqlite:///{tmp / 'flywheel.db'}"
        return
    with postgres_schema("fwweb") as url:
        yield url


def make_workspace(root: Path) -> Path:
    """A two-file project with an off-by-one for the scripted agent to fix."""
    ws = root / "project"
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "stats.py").write_text("def mean(v):\n    return sum(v) / (len(v) - 1)\n")
    (ws / "README.md").write_text("# stats\n\nA tiny package.\n")
    return ws


FIX_TEXT = "Done: <script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned=2\"> mean() is fixed."


def fix_outputs(command: str = "for i in 1 2 3 4; do echo tick $i; sleep 0.25; done") -> list[str]:
    """Three model steps: three parallel calls (two reads and a command that prints as it runs),
    an edit, and a final answer that contains HTML (it must render as text)."""
    return [
        "I'll read the code and the README, and run a check, all at once.\n\n"
        + encode_call("read_file", {"path": "stats.py"}) + "\n" + encode_call("read_file", {"path": "README.md"})
        + "\n" + encode_call("run_command", {"command": command}),
        "The mean divides by len - 1. Fixing it:\n\n"
        + encode_call("edit_file", {"path": "stats.py", "search": "(len(v) - 1)", "replace": "len(v)"}),
        FIX_TEXT,
    ]


@dataclass
class WebServer:
    """``flywheel serve`` with the built app, a staff token and a user token (``alice``)."""

    proc: ServerProcess
    db_url: str
    workspace: Path
    staff: str
    user: str
    log: SessionLog
    _clients: list[httpx.Client] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.proc.url

    def client(self, token: str | None = None) -> httpx.Client:
        c = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token or self.staff}"}, timeout=30)
        self._clients.append(c)
        return c

    def create_session(self, outputs: list[str], *, token: str | None = None, chunk_chars: int = 24,
                       delay_s: float = 0.0, approval_mode: str = "auto", title: str = "") -> dict[str, Any]:
        body = {"workspace": {"path": str(self.workspace)}, "title": title, "approval_mode": approval_mode,
                "policy": {"kind": "scripted", "outputs": outputs, "chunk_chars": chunk_chars, "delay_s": delay_s}}
        r = self.client(token or self.user).post("/v1/sessions", json=body)
        assert r.status_code == 201, r.text
        return r.json()  # type: ignore[no-any-return]

    def events(self, session_id: str) -> list[dict[str, Any]]:
        r = self.client().get(f"/v1/sessions/{session_id}/events", params={"limit": 5000})
        assert r.status_code == 200, r.text
        return r.json()["events"]  # type: ignore[no-any-return]

    def run_turn(self, session_id: str, text: str, *, token: str | None = None, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Send a message over REST and wait for its turn_end; returns every event of the session."""
        c = self.client(token or self.user)
        before = c.get(f"/v1/sessions/{session_id}").json()["last_seq"]
        r = c.post(f"/v1/sessions/{session_id}/messages", json={"text": text})
        assert r.status_code == 202, r.text
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            events = self.events(session_id)
            if any(e["type"] == "turn_end" and e["seq"] > before for e in events):
                return events
            time.sleep(0.1)
        raise AssertionError(f"the turn of {session_id} did not end in {timeout} s")

    def seed_rl_run(self, run_id: str, *, iterations: int = 3, tasks: int = 2, samples: int = 2) -> None:
        """Record an RL run the way ``flywheel rl train`` does (``backend.rl_log.RLSessionLog``): per
        iteration, its metrics and a rollout session per (task, sample) with events and a reward."""
        from backend.rl_log import RLSessionLog
        from tools.workspace import WorkspaceStore

        rl = RLSessionLog(self.log, WorkspaceStore(self.proc.data_dir / "workspaces"))
        rl.record_run({"name": run_id, "iterations": iterations}, run_id=run_id, notes="seeded by tests/web")
        for k in range(1, iterations + 1):
            solved = 0
            for t in range(tasks):
                for j in range(samples):
                    sid = f"{run_id[:8]}i{k}t{t}s{j}"
                    rl.create_session(session_id=sid, run_id=run_id, iteration=k, task_id=f"task-{t}", sample=j)
                    rl.append_events(sid, rollout_events(sid, f"Fix task-{t}.", ok=(j + k + t) % 2 == 0))
                    reward = 1.0 if (j + k + t) % 2 == 0 else -0.2
                    solved += reward > 0
                    rl.finish(sid, reward=reward, status="finished")
            n = tasks * samples
            rl.record_iteration(run_id, k, {
                "iteration": k, "success_rate": solved / n, "mean_reward": 0.1 * k, "tokens_per_solved": 400 - 50 * k,
                "parallel_call_share": 0.2 * k, "blind_edit_rate": 0.3 / k, "logprob_diff_mean": 0.01 * k,
            })
        rl.set_run_status(run_id, "finished")

    def close(self) -> None:
        for c in self._clients:
            c.close()


@contextmanager
def web_server(tmp: Path, *, port: int = 0, db: str = "auto") -> Iterator[WebServer]:
    ws = make_workspace(tmp / "src")
    with database(tmp, db) as url:
        engine = make_engine(url)
        migrate(engine)
        log = SessionLog(engine)
        user = log.create_token("alice", "user")
        staff = log.create_token("sue", "staff")
        proc = ServerProcess(data_dir=tmp / "data", allow_roots=[ws.parent], port=port, extra_args=["--db", url],
                             env={"FLYWHEEL_SEMANTIC_SEARCH": "0", "PYTHONUNBUFFERED": "1"}, log_dir=tmp / "logs")
        with proc:
            srv = WebServer(proc=proc, db_url=url, workspace=ws, staff=staff, user=user, log=log)
            try:
                yield srv
            finally:
                srv.close()
        engine.dispose()


def rollout_events(session_id: str, request: str, *, ok: bool) -> list[dict[str, Any]]:
    """A short rollout's events (one read, then an answer), as a worker would send them."""
    from agent.events import (AssistantDelta, AssistantMessage, ToolCallStarted, ToolResultEvent, TurnEnd,
                              TurnStarted, UserMessage)

    call = encode_call("read_file", {"path": "stats.py"})
    evs = [UserMessage(text=request), TurnStarted(), AssistantDelta(step=1, text="Reading. "),
           ToolCallStarted(step=1, index=0, call_id="t1s1c0", name="read_file", args={"path": "stats.py"}),
           ToolResultEvent(step=1, index=0, call_id="t1s1c0", name="read_file", ok=True, output="1\tdef mean(v):",
                           duration_ms=0.5),
           AssistantMessage(step=1, text="Reading. " + call, output_tokens=20),
           AssistantDelta(step=2, text="Solved." if ok else "Gave up."),
           AssistantMessage(step=2, text="Solved." if ok else "Gave up.", output_tokens=3),
           TurnEnd(reason="completed", steps=2, output_tokens=23)]
    t0 = time.time() - 5
    out = []
    for i, e in enumerate(evs, 1):
        out.append(e.model_copy(update={"seq": i, "session_id": session_id, "turn": 1, "ts": t0 + 0.1 * i})
                   .model_dump(mode="json"))
    return out


class TcpProxy:
    """Forwards 127.0.0.1:<port> to the server. :meth:`cut` takes the socket away from every client
    (the connections die mid-stream, as on a network loss) and refuses new ones until :meth:`restore`."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.refusing = False
        self.cuts = 0
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.refusing:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                self._drop(s)

    def _drop(self, s: socket.socket) -> None:
        with self._lock:
            self._conns.discard(s)
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()

    def cut(self) -> None:
        self.refusing = True
        self.cuts += 1
        with self._lock:
            conns = list(self._conns)
        for s in conns:
            self._drop(s)

    def restore(self) -> None:
        self.refusing = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        self.listener.close()


class Console:
    """Every console error and uncaught exception of a page; :meth:`assert_clean` fails on any that
    the test did not name as expected."""

    def __init__(self, page: Any) -> None:
        self.errors: list[str] = []
        page.on("console", lambda m: m.type in ("error", "warning") and self.errors.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))

    def assert_clean(self, *allowed: str) -> None:
        bad = [e for e in self.errors if not any(re.search(a, e) for a in allowed)]
        assert not bad, "console errors:\n" + "\n".join(bad)


def sign_in(page: Any, base: str, token: str) -> None:
    page.goto(f"{base}/")
    page.fill("#token", token)
    page.click("form[aria-label='sign in'] button[type=submit]")
    page.wait_for_selector("nav.top")


def axe(page: Any, *, context: str = "#app") -> list[dict[str, Any]]:
    """axe-core's violations on the page (WCAG 2 A/AA rules). Injected through the DevTools protocol,
    which the page's Content-Security-Policy does not govern (the app's own CSP stays on)."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.evaluate(AXE.read_text() + "\n;0")
    result = page.evaluate(
        "async (ctx) => (await axe.run(ctx, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa']}})).violations"
        ".map(v => ({id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.slice(0, 3).map(n => n.target.join(' '))}))",
        context,
    )
    return result  # type: ignore[no-any-return]


def check_screen(page: Any, name: str) -> None:
    """The screen passes axe-core's WCAG A/AA rules; then write its screenshot (:func:`screenshot`)."""
    violations = axe(page)
    assert violations == [], violations
    screenshot(page, name)


def screenshot(page: Any, name: str) -> Path:
    """Write docs/screenshots/NAME.png (the committed screenshots are the ones the tests took last)."""
    out = REPO / "docs" / "screenshots" / f"{name}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out))
    return out
