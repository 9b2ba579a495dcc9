"""The session factory: every driver builds its session there, from the same parts the same prompt."""

from __future__ import annotations

import ast
import asyncio
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import pytest

from agent.events import ListSink
from agent.parser import encode_call as call
from agent.policies.scripted import ScriptedPolicy
from agent.prompt import DEFAULT_PROFILE, PromptProfile
from agent.runtime import LazySearchIndex, SessionParts, build_session, session_tools
from agent.session import Limits
from tests.openai_server import ScriptedChatServer
from tools.sandbox import make_sandbox
from tools.workspace import WorkspaceStore

REPO = Path(__file__).resolve().parents[2]
DRIVERS = ("agent", "backend", "rl", "benchmarks")
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")


@pytest.fixture
def src(tmp_path: Path) -> Path:
    d = tmp_path / "src"
    d.mkdir()
    (d / "app.py").write_text("def add(a, b):\n    return a - b\n")
    return d


# -- one factory -----------------------------------------------------------------


def _driver_files() -> Iterable[Path]:
    for pkg in DRIVERS:
        yield from sorted((REPO / pkg).rglob("*.py"))


def test_only_the_factory_constructs_a_session() -> None:
    offenders = []
    for f in _driver_files():
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"), str(f))):
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
                if name == "Session" and f != REPO / "agent" / "runtime.py":
                    offenders.append(f"{f.relative_to(REPO)}:{node.lineno}")
    assert offenders == [], f"Session(...) outside agent/runtime.py (use agent.runtime.build_session): {offenders}"


def test_no_driver_reassigns_a_sessions_policy_or_limits() -> None:
    offenders = []
    for f in _driver_files():
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"), str(f))):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign | ast.AugAssign) else []
            for t in targets:
                own = isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
                if isinstance(t, ast.Attribute) and t.attr in ("policy", "limits") and not own:
                    offenders.append(f"{f.relative_to(REPO)}:{node.lineno}")
    assert offenders == [], f"pass policy/limits to run_turn instead of assigning them: {offenders}"


async def test_policy_and_limits_are_per_turn_arguments_not_attributes(src: Path, tmp_path: Path) -> None:
    ws = WorkspaceStore(tmp_path / "store").from_dir(src)
    default = ScriptedPolicy(["default answer"])
    s = build_session(SessionParts(ws), policy=default, limits=Limits(max_steps=7))
    with pytest.raises(AttributeError):
        s.policy = ScriptedPolicy([])  # type: ignore[misc]
    with pytest.raises(AttributeError):
        s.limits = Limits()  # type: ignore[misc]
    turn = ScriptedPolicy([call("list_dir", {}), "more", "unused"])
    out = await s.run_turn("hi", policy=turn, limits=Limits(max_steps=1))
    assert (out.reason, out.steps, turn.calls, default.calls) == ("max_steps", 1, 1, 0)
    assert s.policy is default and s.limits.max_steps == 7  # back to the session's defaults
    assert (await s.run_turn("again")).final_text == "default answer"


def test_tools_follow_the_parts_and_the_profile_follows_the_policy(src: Path, tmp_path: Path) -> None:
    ws = WorkspaceStore(tmp_path / "store").from_dir(src)
    names = {n: [t.spec.name for t in session_tools(p)] for n, p in {
        "bare": SessionParts(ws),
        "sandbox": SessionParts(ws, sandbox=make_sandbox(allow_unsandboxed=True)),
        "index": SessionParts(ws, search_index=LazySearchIndex(lambda: _Index())),
    }.items()}
    assert "run_command" not in names["bare"] and "semantic_search" not in names["bare"]
    assert "run_command" in names["sandbox"] and "semantic_search" not in names["sandbox"]
    assert "semantic_search" in names["index"] and "run_command" not in names["index"]

    class Profiled(ScriptedPolicy):
        prompt_profile = PromptProfile(name="custom", system="You are a custom agent.")

    assert build_session(SessionParts(ws), policy=ScriptedPolicy([])).profile is DEFAULT_PROFILE
    custom = build_session(SessionParts(ws), policy=Profiled([]))
    assert custom.profile.name == "custom"
    override = PromptProfile(name="explicit")
    assert build_session(SessionParts(ws), policy=Profiled([]), profile=override).profile is override


def test_extra_tools_join_after_the_built_in_ones_and_names_must_differ(src: Path, tmp_path: Path) -> None:
    from tools.read_file import ReadFile
    from tools.write_file import WriteFile

    ws = WorkspaceStore(tmp_path / "store").from_dir(src)

    class Outside(WriteFile):
        spec = replace(WriteFile.spec, name="mcp__x__write")

    names = [t.spec.name for t in session_tools(SessionParts(ws, extra_tools=(Outside(),)))]
    assert names[-1] == "mcp__x__write" and names[:-1] == [t.spec.name for t in session_tools(SessionParts(ws))]
    with pytest.raises(ValueError, match="two tools are named read_file"):
        session_tools(SessionParts(ws, extra_tools=(ReadFile(),)))


# -- the same prompt from every driver ------------------------------------------------


@needs_bwrap
def test_cli_hub_and_replay_send_the_model_the_same_prompt(src: Path, tmp_path: Path) -> None:
    """flywheel run, a hub session and a hub branch (replay, then continue) over the same
    parts (a sandbox, no index) send byte-identical requests to the same model server."""
    from backend.db.engine import make_engine, migrate
    from backend.db.log import SessionLog
    from backend.db.writer import EventWriter
    from backend.hub import Hub
    from backend.policies import PolicyFactory

    step1 = "Looking. " + call("list_dir", {})
    model = ScriptedChatServer([step1, "done", step1, "done", "done"])
    with model.running():
        r = subprocess.run(
            [sys.executable, "-m", "backend.cli", "run", "--workspace", str(src), "--policy", "openai",
             "--base-url", model.base_url, "--json", "fix add"],
            capture_output=True, text=True, timeout=100, cwd=REPO, env={**os.environ, "NO_COLOR": "1"},
        )
        assert r.returncode == 0, r.stderr
        cli = [q["body"]["messages"] for q in model.requests]

        async def hub_driver() -> None:
            engine = make_engine(f"sqlite:///{tmp_path / 'h.db'}")
            migrate(engine)
            log = SessionLog(engine)
            writer = EventWriter(log)
            store = WorkspaceStore(tmp_path / "hub-store")
            hub = Hub(log_=log, writer=writer, store=store, sandbox=make_sandbox(hide=[store.root]),
                      policies=PolicyFactory(openai_base_url=model.base_url))
            try:
                info = await hub.create(owner="a", workspace=store.from_dir(src), title="", source={},
                                        policy={"kind": "openai"})
                await hub.send(info, "fix add")
                await asyncio.wait_for(hub.live[info.id].turn_task, 60)  # type: ignore[arg-type]
                new = await hub.branch(info, owner="a", from_step=1, policy={"kind": "openai"})
                await asyncio.wait_for(hub.live[new.id].turn_task, 60)  # type: ignore[arg-type]
            finally:
                await hub.shutdown()
                writer.close()
                engine.dispose()

        asyncio.run(hub_driver())
    live, branch = [q["body"]["messages"] for q in model.requests[2:4]], model.requests[4]["body"]["messages"]
    assert len(cli) == 2 and cli[0][0]["role"] == "system" and "run_command" in cli[0][0]["content"]
    assert live == cli  # same system prompt, same tool results rendered the same way
    assert branch == cli[1]  # the branch replayed step 1 and asked the model exactly what the original did


# -- the lazily built replay index ------------------------------------------------------


class _Index:
    """A counterpart search index that records what it was told."""

    def __init__(self) -> None:
        self.notified: list[tuple[list[str], bool]] = []
        self.searches = 0

    def search(self, query: str, k: int = 10, path_glob: str | None = None) -> list:
        self.searches += 1
        return []

    def notify_edits(self, paths: Iterable[str], *, tree_changed: bool = False) -> None:
        self.notified.append((sorted(paths), tree_changed))


def test_lazy_index_builds_once_at_the_first_search_and_keeps_earlier_edits() -> None:
    built: list[_Index] = []
    gate = threading.Event()

    def build() -> _Index:
        gate.wait(5)
        time.sleep(0.05)  # let the other first search arrive while this build runs
        built.append(_Index())
        return built[-1]

    lazy = LazySearchIndex(build)
    lazy.notify_edits(["a.py"])
    lazy.notify_edits(["b.py"], tree_changed=True)
    assert not lazy.built and built == []  # edits alone build nothing
    threads = [threading.Thread(target=lazy.search, args=("q",)) for _ in range(4)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(10)
    assert len(built) == 1 and built[0].searches == 4
    assert built[0].notified == [(["a.py", "b.py"], True)]
    lazy.notify_edits(["c.py"])
    assert built[0].notified[-1] == (["c.py"], False)


def test_lazy_index_build_failure_is_raised_and_retried() -> None:
    attempts: list[int] = []

    def build() -> _Index:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("embedder unavailable")
        return _Index()

    lazy = LazySearchIndex(build)
    with pytest.raises(RuntimeError, match="embedder unavailable"):
        lazy.search("q")
    assert lazy.search("q") == [] and lazy.built and len(attempts) == 2
