"""How a workspace's tree is laid out on disk, and the mechanics of making and removing one.

Each workspace is a directory of its store::

    ws/<id>/tree          what tools and commands see (an overlay mountpoint, or a plain directory)
    ws/<id>/upper, work   the overlay's upper and work directories (copy-on-write layouts only)
    ws/<id>/meta.json     its starting snapshot id and :class:`Layout`

A :class:`Layout` says where the files come from: for
:attr:`Layering.OVERLAY`, read-only store layers (see :mod:`tools.layers`)
and possibly a host directory used in place, under the private upper;
otherwise a plain copy. :class:`TreeMaker` mounts, freezes, copies and
removes; :class:`tools.workspace.WorkspaceStore` decides which.

Not guaranteed: a fork taken while a command writes in the parent's tree
may freeze a half-written file (the upper is copied as it is).
"""

from __future__ import annotations

import enum
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.layers import LayerStore
from tools.overlay import OverlayError, is_mountpoint, mount_overlay, unmount
from tools.treecopy import CopyError, copy_tree
from tools.treewalk import TreeLimitError, remove_path, scan_tree, short_path

__all__ = ["MAX_LAYERS", "Layering", "Layout", "TreeMaker", "WorkspaceError"]

MAX_LAYERS = 16
"""Store layers one overlay stacks; a fork that would need more flattens them into one full copy."""


class WorkspaceError(Exception):
    """A workspace could not be created, found or changed (not the model's fault)."""


class Layering(enum.StrEnum):
    """How a workspace's tree is made."""

    OVERLAY = "overlay"  # copy-on-write: an overlay mount over read-only layers
    REFLINK = "reflink"  # a plain directory copied with reflinks (data shared until written)
    COPY = "copy"  # a plain directory, fully copied
    ATTACHED = "attached"  # a host directory itself, no copy (WorkspaceStore.attach): tools write into it


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a workspace's files come from (its ``meta.json``).

    For :attr:`Layering.OVERLAY` the lower layers are, top first, the store
    layers ``layers`` (changes frozen at forks; at the bottom, unless
    ``source`` is set, a copy, a restored snapshot or a git archive) and then
    ``source``, a host directory used in place, read-only. ``origin`` is where
    the snapshots' ignored files come from (see
    :attr:`tools.snapshots.Snapshot.origin`). ``note`` says why a fallback was used.
    """

    layering: Layering = Layering.COPY
    layers: tuple[str, ...] = ()
    source: str | None = None
    origin: str | None = None
    note: str = ""

    def describe(self) -> str:
        """One line for a user: how the workspace was made (and why, for a fallback)."""
        if self.layering is Layering.OVERLAY:
            what = f"copy-on-write over {self.source}" if self.source else "copy-on-write over a copy"
        elif self.layering is Layering.ATTACHED:
            what = f"the directory {self.origin} itself (no copy: edits land there)"
        else:
            what = f"{self.layering} of the tree (no overlay)"
        return f"{what}; {self.note}" if self.note else what

    def to_json(self, base_id: str) -> dict[str, Any]:
        return {"base": base_id, "layering": str(self.layering), "layers": list(self.layers),
                "source": self.source, "origin": self.origin, "note": self.note}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Layout:
        """Older stores wrote only ``base``: their trees are plain copies."""
        return cls(Layering(obj.get("layering", "copy")), tuple(obj.get("layers", ())), obj.get("source"),
                   obj.get("origin"), str(obj.get("note", "")))


class TreeMaker:
    """Makes, mounts, freezes and removes workspace directories under ``root/ws``."""

    def __init__(self, root: Path, layers: LayerStore, *, progress: bool) -> None:
        self.root = root
        self.layers = layers
        self.progress = progress

    def new_dir(self) -> tuple[str, Path]:
        """A new, empty ``ws/<id>`` and the path its tree will have."""
        while True:
            ws_id = secrets.token_hex(8)
            try:
                (self.root / "ws" / ws_id).mkdir()
                return ws_id, self.root / "ws" / ws_id / "tree"
            except FileExistsError:
                continue

    def mount(self, ws_id: str, layout: Layout) -> None:
        """Make ``ws/<id>/tree`` an overlay of ``layout``'s layers (already acquired)."""
        ws_dir = self.root / "ws" / ws_id
        for sub in ("tree", "upper", "work"):
            (ws_dir / sub).mkdir(exist_ok=True)
        lowers = [self.layers.path(lid) for lid in layout.layers]
        if layout.source is not None:
            lowers.append(Path(layout.source))
        mount_overlay(ws_dir / "tree", lowers, ws_dir / "upper", ws_dir / "work")

    def start(self, ws_id: str, layout: Layout) -> None:
        """Record ``ws_id`` as a user of the layout's layers and mount it; on failure, undo both."""
        self.layers.acquire(layout.layers, ws_id)
        try:
            self.mount(ws_id, layout)
        except BaseException:
            self.layers.release(layout.layers, ws_id)
            raise

    def remove(self, ws_id: str, layout: Layout) -> None:
        """Unmount (never walking into a mount) and remove ``ws/<id>``, and release its layers."""
        ws_dir = self.root / "ws" / ws_id
        tree = ws_dir / "tree"
        if layout.layering is Layering.OVERLAY:
            try:
                unmount(tree)
            except OverlayError as exc:
                raise WorkspaceError(f"cannot remove workspace {ws_id}: {exc}") from None
            if is_mountpoint(tree):  # its lower layers are not ours to delete
                raise WorkspaceError(f"cannot remove workspace {ws_id}: {tree} is still mounted")
        remove_path(ws_dir)
        if layout.layers:
            self.layers.release(layout.layers, ws_id)

    def copy(self, src: Path, dst: Path, *, what: str) -> Layering:
        """Copy ``src`` to ``dst`` (which may exist, empty); WorkspaceError naming the cause."""
        if dst.exists():
            os.rmdir(dst)
        try:
            return Layering(str(copy_tree(src, dst, what=what, progress=self.progress)))
        except CopyError as exc:
            remove_path(dst)
            try:  # the likely reason cp fails on a readable tree: one too deep for full paths
                for _ in scan_tree(src):
                    pass
            except TreeLimitError as limit:
                raise WorkspaceError(f"cannot copy {src}: {limit}; workspaces hold trees up to that depth") from None
            raise WorkspaceError(f"copying {src} failed: {short_path(exc.strerror or str(exc), 1000)}") from None

    def fork_layout(self, parent_root: Path, layout: Layout) -> Layout:
        """The layout of a fork of the overlay workspace at ``parent_root``.

        The parent's changes so far (its upper) are copied verbatim into a
        new layer on top of its layers; none: the same layers, nothing
        copied. A stack that would pass :data:`MAX_LAYERS` is flattened
        into one full copy of the parent's tree. The new layer has no users
        yet: the caller starts the fork or discards it.
        """
        upper = parent_root.parent / "upper"
        if not _has_entries(upper):
            return layout
        lid, layer = self.layers.create()
        try:
            if len(layout.layers) + 1 > MAX_LAYERS:
                method = self.copy(parent_root, layer, what="flattening a workspace's layers")
                return Layout(Layering.OVERLAY, layers=(lid,), origin=layout.origin,
                              note=f"flattened ({method}) after {MAX_LAYERS} layers")
            self.copy(upper, layer, what="freezing a workspace's changes")
        except BaseException:
            self.layers.discard(lid)
            raise
        return Layout(Layering.OVERLAY, layers=(lid, *layout.layers), source=layout.source,
                      origin=layout.origin, note=layout.note)


def _has_entries(path: Path) -> bool:
    try:
        with os.scandir(path) as it:
            return next(it, None) is not None
    except FileNotFoundError:
        return False
