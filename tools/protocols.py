"""The seams a session is assembled from: what tools and the agent loop need of
a workspace, a sandbox and a search index, as ``typing.Protocol``s.

``agent.runtime.build_session`` and :class:`tools.base.ToolContext` are typed
against these, not against the concrete classes, so a driver (the server, the
CLI, replay, an RL rollout worker) may pass any implementation:

* :class:`Workspace` — :class:`tools.workspace.Workspace` is the production one;
* :class:`Sandbox` — :class:`tools.sandbox.BubblewrapSandbox` (re-exported from
  :mod:`tools.sandbox`, where it is defined);
* :class:`SearchIndex` — :class:`embeddings.index.WorkspaceIndex`,
  :class:`embeddings.background.BackgroundIndex` and
  :class:`agent.runtime.LazySearchIndex`.

Nothing here imports ``embeddings`` at runtime (only for type checking), so
declaring a search index costs no model load.

Not guaranteed: the protocols are checked statically (mypy) and, where marked
``runtime_checkable``, only by method *names* at runtime; an object with the
right names and wrong semantics (a workspace whose ``resolve`` follows links
out of the tree) is not detected.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from tools.sandbox import Sandbox

if TYPE_CHECKING:
    # Re-exported for type checkers (agent/ may not import embeddings/, even for types).
    from embeddings.types import SearchHit as SearchHit
    from tools.base import FileEdit
    from tools.diffs import ChangeEntry
    from tools.snapshots import Snapshot
    from tools.workspace import DirEntryInfo

__all__ = ["Sandbox", "SearchIndex", "Workspace"]


@runtime_checkable
class Workspace(Protocol):
    """An isolated tree the tools act on. Every path argument is relative to
    ``root`` and model-supplied: implementations must refuse paths (and links)
    that lead outside it (raising :class:`tools.paths.PathError`)."""

    @property
    def root(self) -> Path:
        """The tree's absolute, resolved directory (commands run here)."""
        ...

    def resolve(self, rel: str) -> str: ...

    def real_path(self, rel: str) -> str: ...

    def exists(self, rel: str) -> bool: ...

    def is_dir(self, rel: str) -> bool: ...

    def read_bytes(self, rel: str, *, limit: int | None = None) -> bytes: ...

    def file_size(self, rel: str) -> int:
        """Size of the regular file ``rel`` (read_file refuses large files before reading)."""
        ...

    def write_bytes(self, rel: str, data: bytes) -> FileEdit: ...

    def listdir(self, rel: str = ".") -> list[DirEntryInfo]: ...

    def fork(self) -> Workspace:
        """An independent copy of the current state (RL: one per rollout)."""
        ...

    def snapshot(self) -> Snapshot:
        """The exact current state, restorable (replay's starting point)."""
        ...

    def diff(self, base: Snapshot | None = None) -> str:
        """A unified diff of the tree against ``base`` (default: its starting state)."""
        ...

    def changed_paths(self, base: Snapshot | None = None) -> list[ChangeEntry]: ...


@runtime_checkable
class SearchIndex(Protocol):
    """What ``semantic_search`` and the executor need of an index over a
    workspace. ``search`` may block (it runs in a worker thread) and may raise
    :class:`embeddings.background.IndexNotReady`, which the tool reports to the
    model; ``notify_edits`` must be cheap and must not block on a search."""

    def search(self, query: str, k: int = 10, path_glob: str | None = None) -> list[SearchHit]: ...

    def notify_edits(self, paths: Iterable[str], *, tree_changed: bool = False) -> None: ...
