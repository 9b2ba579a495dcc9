"""Read-only layers that copy-on-write workspaces mount, counted by the workspaces using them.

A :class:`LayerStore` is a directory::

    layers/<id>/               a layer's files: never written once a workspace mounts it
    layers/<id>.users/<ws_id>  one empty file per workspace that mounts the layer
    layers/.lock               taken (flock) while users are added or removed

A layer is made by copying a source that may not be used in place, by
restoring a snapshot, by extracting a git archive, or by freezing a
workspace's changes when it is forked (a verbatim copy of its overlay upper,
whiteouts and overlay xattrs included, which keeps its meaning above the same
layers). It is removed when its last user is released.

Not guaranteed: a layer made by a process that died before any workspace used
it is never removed.
"""

from __future__ import annotations

import fcntl
import os
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tools.treewalk import remove_path

__all__ = ["LayerError", "LayerStore"]


class LayerError(Exception):
    """A layer a workspace needs is missing."""


class LayerStore:
    """Layers under ``root`` and the workspaces that use them."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, layer_id: str) -> Path:
        return self.root / layer_id

    def create(self) -> tuple[str, Path]:
        """A new, empty layer with no users (fill it, then :meth:`acquire` it, or :meth:`discard` it)."""
        while True:
            layer_id = secrets.token_hex(8)
            try:
                (self.root / layer_id).mkdir()
                return layer_id, self.root / layer_id
            except FileExistsError:
                continue

    def discard(self, layer_id: str) -> None:
        """Remove a layer that no workspace uses (one whose making failed)."""
        remove_path(self.root / layer_id)
        remove_path(self.root / f"{layer_id}.users")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def acquire(self, layer_ids: Iterable[str], user: str) -> None:
        """Record ``user`` (a workspace id) as using each layer; LayerError if one is gone."""
        with self._locked():
            for lid in layer_ids:
                if not (self.root / lid).is_dir():
                    raise LayerError(f"layer {lid} is missing from {self.root}")
                users = self.root / f"{lid}.users"
                users.mkdir(exist_ok=True)
                (users / user).touch()

    def release(self, layer_ids: Iterable[str], user: str) -> None:
        """Forget ``user``; a layer left without users is removed."""
        with self._locked():
            for lid in layer_ids:
                users = self.root / f"{lid}.users"
                try:
                    (users / user).unlink()
                except FileNotFoundError:
                    pass
                try:
                    if any(users.iterdir()):
                        continue
                except FileNotFoundError:
                    pass
                self.discard(lid)

    def users(self, layer_id: str) -> list[str]:
        try:
            return sorted(p.name for p in (self.root / f"{layer_id}.users").iterdir())
        except FileNotFoundError:
            return []
