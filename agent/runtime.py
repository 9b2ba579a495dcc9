"""The one session factory. Every driver — the server's hub, ``flywheel run``,
replay (re-execute and branch), the RL rollout workers — builds its
``Session`` here, so the same parts always give the same session: the same
tool set, the same prompt, the same limits.

A session is assembled from Protocol-typed parts (:mod:`tools.protocols`):

* :class:`SessionParts` — what comes from the environment: the workspace,
  the sandbox (None: no ``run_command``), the search index (None: no
  ``semantic_search``), and tools from outside (``extra_tools``: an MCP
  server's, :mod:`tools.mcp_client`), which join the built-in ones;
* the policy and its limits (defaults for the session; a turn may override
  both, ``Session.run_turn(policy=, limits=)``);
* the prompt profile, by default the policy's own (``policy.prompt_profile``,
  which a local checkpoint carries) or :data:`agent.prompt.DEFAULT_PROFILE`;
  a policy that learns its profile at first use (``prompt_profile`` None and a
  ``resolve_prompt_profile()`` coroutine: an OpenAI-compatible server in
  completions mode) is asked by the session before its first prompt.

The tool set is derived from the parts (:func:`session_tools`), so a model is
never told about a tool its session cannot run, and two drivers given the
same parts render byte-identical prompts.

:class:`LazySearchIndex` is an index that is built (completely, in the
calling thread) at its first search: replay uses it so that re-executing a
session that never searched never loads the embedder.

Not guaranteed: the factory does not check that the parts belong together
(an index over another tree than ``workspace.root``); it does not close the
policy, the sandbox or the index — whoever made them does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.approval import ApprovalDecision, ApprovalMode, Approver
from agent.events import EventSink
from agent.history import History
from agent.policy import Policy
from agent.prompt import DEFAULT_PROFILE, PromptProfile
from agent.session import Limits, Session
from tools.base import Tool
from tools.registry import default_tools

if TYPE_CHECKING:
    from tools.protocols import Sandbox, SearchHit, SearchIndex, Workspace

__all__ = ["LazySearchIndex", "SessionParts", "build_session", "prompt_profile_for", "session_tools"]


@dataclass(frozen=True, slots=True)
class SessionParts:
    """The environment a session acts in. Cheap to copy; shares its parts."""

    workspace: Workspace
    sandbox: Sandbox | None = None
    search_index: SearchIndex | None = None
    extra_tools: tuple[Tool, ...] = ()


def session_tools(parts: SessionParts) -> list[Tool]:
    """The tool set for ``parts``: the built-in tools, plus ``run_command`` when
    there is a sandbox and ``semantic_search`` when there is an index, then
    ``parts.extra_tools`` in their order. ``ValueError`` if two tools share a name."""
    tools = default_tools(commands=parts.sandbox is not None, semantic_search=parts.search_index is not None)
    tools += parts.extra_tools
    names = [t.spec.name for t in tools]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise ValueError(f"two tools are named {', '.join(clash)}")
    return tools


def prompt_profile_for(policy: Policy, profile: PromptProfile | None = None) -> PromptProfile | None:
    """``profile`` if given, else the policy's own (``policy.prompt_profile``), else the default;
    None for a policy that learns its own at first use (``resolve_prompt_profile``: the session
    awaits it before rendering its first prompt)."""
    if profile is not None:
        return profile
    own = getattr(policy, "prompt_profile", None)
    if own is None and callable(getattr(policy, "resolve_prompt_profile", None)):
        return None
    return own if isinstance(own, PromptProfile) else DEFAULT_PROFILE


def build_session(
    parts: SessionParts,
    *,
    policy: Policy,
    limits: Limits = Limits(),
    profile: PromptProfile | None = None,
    sink: EventSink | None = None,
    session_id: str | None = None,
    history: History | None = None,
    tools: Sequence[Tool] | None = None,
    approval_mode: ApprovalMode = "auto",
    approver: Approver | None = None,
    recorded_approvals: Mapping[str, ApprovalDecision | None] | None = None,
) -> Session:
    """A session over ``parts`` driven by ``policy`` (its default; turns may pass another).

    ``history`` resumes a recorded session (its conversation, next ``seq`` and
    turn count, as :func:`agent.history.history_from_events` rebuilt them).
    ``tools`` replaces the derived tool set; it exists for benchmarks that
    time the loop with an instrumented tool — drivers leave it None.

    ``approval_mode`` (:mod:`agent.approval`; RL and replay keep ``auto``) says
    which calls wait for ``approver``'s answer; a mode other than ``auto``
    without an approver raises ``ValueError``. ``recorded_approvals``
    (:func:`agent.approval.recorded_decisions`) are answers to re-apply, once
    each, to the calls with those ids, whatever the mode (None: run it without
    asking, as the recording did): replay and branches pass them so a recorded
    refusal is refused again and a re-executed step never waits for a user.
    """
    h = history or History()
    return Session(
        workspace=parts.workspace,
        policy=policy,
        tools=list(tools) if tools is not None else session_tools(parts),
        sink=sink,
        sandbox=parts.sandbox,
        limits=limits,
        session_id=session_id,
        profile=prompt_profile_for(policy, profile),
        conversation=h.conversation,
        next_seq=h.last_seq + 1,
        turns_done=h.turns,
        search_index=parts.search_index,
        approval_mode=approval_mode,
        approver=approver,
        recorded_approvals=recorded_approvals,
    )


class LazySearchIndex:
    """A :class:`tools.protocols.SearchIndex` built by ``build()`` at its first
    search, completely, before that search answers (unlike a server's
    ``BackgroundIndex``, it never answers "still being built").

    Edits reported before the build are kept and passed on once it exists
    (the build reads the tree as it is then, so they are already in it; passing
    them on only costs a re-read). Thread-safe: concurrent first searches
    build once. A failed build raises from that search and is retried by the
    next one. Not guaranteed: bounded build time — the first search costs a
    full index of the tree (and the embedder's load, if it was not loaded).
    """

    def __init__(self, build: Callable[[], SearchIndex]) -> None:
        self._build = build
        self._index: SearchIndex | None = None
        self._build_lock = threading.Lock()  # one build at a time
        self._lock = threading.Lock()  # guards _index and the pending edits; never held during a build
        self._pending: set[str] = set()
        self._tree_changed = False

    @property
    def built(self) -> bool:
        return self._index is not None

    def notify_edits(self, paths: Iterable[str], *, tree_changed: bool = False) -> None:
        with self._lock:
            index = self._index
            if index is None:
                self._pending.update(paths)
                self._tree_changed |= tree_changed
                return
        index.notify_edits(paths, tree_changed=tree_changed)

    def search(self, query: str, k: int = 10, path_glob: str | None = None) -> list[SearchHit]:
        return self._ensure().search(query, k, path_glob)

    def _ensure(self) -> SearchIndex:
        index = self._index
        if index is not None:
            return index
        with self._build_lock:
            index = self._index
            if index is None:
                index = self._build()
                with self._lock:
                    self._index = index
                    pending, tree_changed = sorted(self._pending), self._tree_changed
                    self._pending, self._tree_changed = set(), False
                if pending or tree_changed:
                    index.notify_edits(pending, tree_changed=tree_changed)
            return index

    def close(self) -> None:
        """Close the built index, if any and if it can be closed (idempotent)."""
        with self._lock:
            index, self._index = self._index, None
        close = getattr(index, "close", None)
        if close is not None:
            close()
