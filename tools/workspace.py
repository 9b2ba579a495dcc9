"""Isolated, stateful workspaces: create, open, fork, delete (copy-on-write where it can).

A :class:`WorkspaceStore` is a directory::

    root/ws/<id>/tree          one workspace's files (what tools and commands see)
    root/ws/<id>/upper, work   its overlay's upper and work directories (copy-on-write)
    root/ws/<id>/meta.json     its starting snapshot id and layout (tools.workspace_layout.Layout)
    root/layers/<id>/          read-only layers workspaces mount (see tools.layers)
    root/blobs/ab/cdef...      file bytes, content-addressed, shared by every workspace
    root/snapshots/<id>.json   snapshot manifests (see tools.snapshots)

Where overlays can be mounted here (root, see :mod:`tools.overlay`), a
workspace's tree is an overlay: ``from_dir(src, in_place=True)`` uses ``src``
itself as the read-only lower layer (milliseconds, whatever its size: a 3 GB
tree with a virtualenv opens at the cost of snapshotting what ``.gitignore``
does not hide); ``from_dir(src)`` copies ``src`` into a store layer first (the
source may then change or go away); ``fork`` freezes the parent's changes so
far into a layer both share and mounts a new overlay (milliseconds when there
are none: an RL rollout's fork of an untouched base); ``delete`` unmounts.
Elsewhere (no overlay: not root, or an upper file system overlayfs refuses)
trees are plain directories made with ``cp -a``, with reflinks where the file
system has them, and a progress bar on stderr for a copy that takes more
than a second. :attr:`Workspace.layering` and :meth:`Layout.describe
<tools.workspace_layout.Layout.describe>` say which was used, and why.

Snapshots, diffs and change summaries show what ``.gitignore`` does not hide
(see :mod:`tools.workspace_tree`); the starting snapshot of a source that is a
git work tree also holds its tracked files, ignored or not.

Limits (each fails with a clear error or a note, never by exhausting memory):
a workspace is created only if what it shows can be snapshotted exactly, so a
shown file over ``max_file_bytes`` (default 1 GiB, apparent size) or a tree
deeper than :data:`~tools.treewalk.MAX_TREE_DEPTH` levels makes creation fail
with a :class:`WorkspaceError` naming the file. Later (after a model made such
a file or tree), ``diff`` shows files over
:data:`~tools.diffs.MAX_DIFF_FILE_BYTES` as "large file, not shown", notes
directories too deep to walk, ``restore`` removes them, ``snapshot`` refuses
them, and ``delete`` removes trees of any depth. Changes under ``.git`` are
shown like any others. Before a workspace is handed to the host's git, call
:meth:`Workspace.neutralise_git` (see :mod:`tools.gitsafe`).

Not guaranteed: an in-place source must stay where it is while its workspaces
live, and changes made to it meanwhile show through in files the workspace
has not written (overlayfs); a fork taken while a command runs in the parent
may see that command's later writes; a workspace made from a snapshot has the
snapshot's ignored files only if its ``origin`` directory still exists (as it
is now); snapshots do not capture special files, ownership, timestamps,
xattrs or hard links (see :mod:`tools.snapshots`).
"""

from __future__ import annotations

import json
import os
import re
import secrets
from pathlib import Path

from tools.blobs import BlobStore
from tools.diffs import ChangeEntry, ChangeKind, unified_diff
from tools.gitignore import IgnoreRules, tree_loader
from tools.gitsafe import GitArchiveError, archive_into, host_git, tracked_paths
from tools.layers import LayerError, LayerStore
from tools.overlay import OverlayError, detach_under, is_mountpoint, overlay_unavailable
from tools.delayed_progress import DelayedProgress
from tools.snapshots import (
    MAX_SNAPSHOT_FILE_BYTES,
    EntryKind,
    Snapshot,
    SnapshotError,
    build_manifest,
    restore_tree,
)
from tools.treewalk import remove_path, short_path
from tools.workspace_layout import MAX_LAYERS, Layering, Layout, TreeMaker, WorkspaceError
from tools.workspace_tree import DirEntryInfo, Workspace

__all__ = [
    "MAX_LAYERS", "ChangeEntry", "ChangeKind", "DirEntryInfo", "Layering", "Layout", "MissingBlob", "Snapshot",
    "Workspace", "WorkspaceError", "WorkspaceStore", "remove_store", "unified_diff",
]
_ID_RE = re.compile(r"[0-9a-f]{16}")
_HEX64_RE = re.compile(r"[0-9a-f]{64}")


def remove_store(root: str | os.PathLike[str]) -> None:
    """Remove a store's directory (e.g. a temporary one) and everything in it, unmounting first what is
    still mounted beneath it, even by a process that was just killed (:func:`tools.overlay.detach_under`).
    A missing directory is not an error."""
    path = Path(root)
    if path.exists():
        detach_under(path.resolve())
        remove_path(path)


class MissingBlob(SnapshotError):
    """A snapshot's file whose bytes are in neither store (:meth:`WorkspaceStore.import_snapshot`)."""

    def __init__(self, path: str, sha256: str):
        super().__init__(f"the bytes of {path!r} (blob {sha256}) are in neither store")
        self.path, self.sha256 = path, sha256


class WorkspaceStore:
    """Where workspaces, layers, blobs and snapshot manifests live (one directory).

    ``max_file_bytes`` is the largest file a snapshot (so a workspace) may
    hold. ``overlay``: False (the default) never mounts (plain copies); None
    uses overlays where they work here; True requires them
    (:class:`WorkspaceError` if they do not work). A store that mounts must be
    let go of synchronously: :meth:`unmount_all` when its process is done
    with it, :func:`remove_store` to delete its directory (a plain ``rmtree``
    right after a process holding mounts was killed fails with EBUSY, since
    that process's reaper detaches them asynchronously). ``flywheel serve``
    mounts (it unmounts at shutdown and cleans stale mounts at start); other
    callers opt in. ``progress``: show a bar on stderr for copies that take time.
    """

    def __init__(self, root: Path, *, max_file_bytes: int = MAX_SNAPSHOT_FILE_BYTES,
                 overlay: bool | None = False, progress: bool = True) -> None:
        self.max_file_bytes = max_file_bytes
        self.progress = progress
        self.root = Path(root)
        for sub in ("ws", "blobs", "snapshots", "layers"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.root = self.root.resolve()
        self.blobs = BlobStore(self.root / "blobs")
        self.layers = LayerStore(self.root / "layers")
        self.trees = TreeMaker(self.root, self.layers, progress=progress)
        self._overlay_wanted = overlay
        self._overlay_reason: str | None = None if overlay is not False else "overlays turned off for this store"
        self._probed = overlay is False

    # -- how trees are made
    def overlay_unavailable(self) -> str | None:
        """None if this store mounts overlays, else why not (probed once)."""
        if not self._probed:
            self._overlay_reason = overlay_unavailable(self.root)
            self._probed = True
            if self._overlay_reason is not None and self._overlay_wanted:
                raise WorkspaceError(f"overlays do not work in {self.root}: {self._overlay_reason}")
        return self._overlay_reason

    def _finish(self, ws_id: str, layout: Layout, base: Snapshot | None, *,
                kept: set[str] | None = None, ignore: bool = True) -> Workspace:
        """Write ``meta.json``, taking the base snapshot first when there is none; undo everything on failure."""
        tree = self.root / "ws" / ws_id / "tree"
        try:
            if base is None:
                # an in-place source is hashed through its own path (no overlay on the way), and its
                # blobs are stored in the background: the workspace is usable once it is hashed
                later = layout.source is not None
                walk = Path(layout.source) if later and layout.source else tree
                rules = IgnoreRules(tree_loader(walk), kept or set()) if ignore else None
                try:
                    with DelayedProgress(f"snapshotting {walk}", unit="file", enabled=self.progress) as bar:
                        manifest = build_manifest(walk, None if later else self.blobs, ignore=rules, strict=True,
                                                  max_file_bytes=self.max_file_bytes, progress=bar)
                except SnapshotError as exc:
                    raise WorkspaceError(f"cannot create the workspace: {exc}") from None
                except OSError as exc:  # an unreadable file or directory of the source
                    what = f" {short_path(exc.filename)!r}" if isinstance(exc.filename, str) else ""
                    raise WorkspaceError(f"cannot create the workspace: cannot read{what} ({exc.strerror})") from None
                if later:
                    self.blobs.put_later(walk, [(p, e.sha256, e.size) for p, e in manifest.items()
                                                if e.sha256 is not None])
                base = Snapshot.from_manifest(manifest, layout.origin)
                self.save_snapshot(base)
            (self.root / "ws" / ws_id / "meta.json").write_text(json.dumps(layout.to_json(base.id)))
        except BaseException:
            self.trees.remove(ws_id, layout)
            raise
        return Workspace(ws_id, tree, self, base, layout)

    # -- creating workspaces
    def from_dir(self, src: str | os.PathLike[str], *, in_place: bool = False) -> Workspace:
        """A new workspace holding the directory ``src`` (symlinks kept as links).

        ``in_place``: use ``src`` itself as the read-only lower layer of a
        copy-on-write workspace (instant; ``src`` must stay, and is never
        written). Otherwise, or where overlays do not work here, ``src`` is
        copied (with a progress bar on stderr when that takes time).
        """
        if not os.path.isdir(src):
            raise WorkspaceError(f"not a directory: {src}")
        source = Path(os.path.realpath(src))
        if self.root.is_relative_to(source):
            raise WorkspaceError(f"cannot open {src}: the workspace store {self.root} lies inside it "
                                 "(keep the data directory outside the project)")
        kept = tracked_paths(source)
        ws_id, tree = self.trees.new_dir()
        reason = self.overlay_unavailable()
        note = ""
        if reason is None and in_place:
            layout = Layout(Layering.OVERLAY, source=os.fspath(source), origin=os.fspath(source))
            try:
                self.trees.start(ws_id, layout)
            except OverlayError as exc:  # e.g. the store lies inside the source
                self.trees.remove(ws_id, layout)
                ws_id, tree = self.trees.new_dir()
                note = f"not in place: {src} cannot be a lower layer ({os.strerror(exc.errno or 0)})"
            else:
                return self._finish(ws_id, layout, None, kept=kept)
        if reason is None:
            lid, layer = self.layers.create()
            layout = Layout(Layering.OVERLAY, layers=(lid,))
            try:
                method = self.trees.copy(source, layer, what=f"copying {src}")
                layout = Layout(Layering.OVERLAY, layers=(lid,), note="; ".join(
                    x for x in (note, f"source copied ({method})") if x))
                self.trees.start(ws_id, layout)
            except BaseException:
                self.trees.remove(ws_id, layout)  # releases the layer: nobody else uses it
                self.layers.discard(lid)
                raise
            return self._finish(ws_id, layout, None, kept=kept)
        try:
            method = self.trees.copy(source, tree, what=f"copying {src}")
        except BaseException:
            remove_path(tree.parent)
            raise
        note = "not in place: " + reason if in_place else reason
        return self._finish(ws_id, Layout(Layering(str(method)), note=note), None, kept=kept)

    def attach(self, directory: str | os.PathLike[str]) -> Workspace:
        """The directory itself as a workspace: no copy, no snapshot taken. Tools read and
        write it in place, with the same path rules as in any workspace (nothing outside it;
        ``flywheel mcp`` serves a project this way). ``delete`` leaves the directory as it
        is (the store does not own it); ``fork`` copies it into the store; ``base`` is
        unset, so ``diff()`` needs an explicit snapshot. Not guaranteed: isolation from
        other writers (the user's editor) — it is their directory."""
        if not os.path.isdir(directory):
            raise WorkspaceError(f"not a directory: {directory}")
        source = Path(os.path.realpath(directory))
        if self.root.is_relative_to(source):
            raise WorkspaceError(f"cannot attach {directory}: the workspace store {self.root} lies inside it")
        layout = Layout(Layering.ATTACHED, origin=os.fspath(source), note="attached in place")
        return Workspace(f"attached-{secrets.token_hex(8)}", source, self, None, layout)

    def from_git(self, repo: str | os.PathLike[str], commit: str) -> Workspace:
        """A new workspace holding ``git archive`` of ``commit`` (no ``.git``, no submodules).

        Every file of the archive is tracked, so the starting snapshot holds all of them.
        """
        if not commit or commit.startswith("-"):
            raise WorkspaceError(f"invalid commit name {commit!r}")
        probe = host_git(repo, "rev-parse", "--git-dir")
        if probe.returncode != 0:
            raise WorkspaceError(f"not a git repository: {repo} ({probe.stderr.strip()})")
        rev = host_git(repo, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
        if rev.returncode != 0:
            raise WorkspaceError(f"unknown commit {commit!r} in {repo}")
        sha = rev.stdout.strip()
        ws_id, tree = self.trees.new_dir()
        overlay = self.overlay_unavailable() is None
        lid, dest = self.layers.create() if overlay else (None, tree)
        dest.mkdir(exist_ok=True)
        try:
            archive_into(repo, sha, dest)
        except GitArchiveError as exc:
            if lid is not None:
                self.layers.discard(lid)
            remove_path(tree.parent)
            raise WorkspaceError(f"git archive {sha} failed: {exc}") from None
        except BaseException:
            if lid is not None:
                self.layers.discard(lid)
            remove_path(tree.parent)
            raise
        if lid is None:
            return self._finish(ws_id, Layout(Layering.COPY, note=self._overlay_reason or ""), None, ignore=False)
        layout = Layout(Layering.OVERLAY, layers=(lid,), note="git archive")
        try:
            self.trees.start(ws_id, layout)
        except BaseException:
            self.trees.remove(ws_id, layout)
            self.layers.discard(lid)
            raise
        return self._finish(ws_id, layout, None, ignore=False)

    def from_snapshot(self, snapshot: Snapshot) -> Workspace:
        """A new workspace at exactly ``snapshot``'s state (its base is that snapshot).

        Its ignored files are those of the snapshot's ``origin`` directory
        (mounted in place where overlays work, copied otherwise) if that still
        exists; without one, it holds the snapshot's paths only.
        """
        ws_id, tree = self.trees.new_dir()
        origin = snapshot.origin if snapshot.origin and os.path.isdir(snapshot.origin) else None
        overlay = self.overlay_unavailable() is None
        layout: Layout | None = None
        if overlay and origin is not None:
            layout = Layout(Layering.OVERLAY, source=origin, origin=origin, note="snapshot over its origin")
            try:
                self.trees.start(ws_id, layout)
            except OverlayError:  # the origin cannot be a lower layer here: the snapshot's paths only
                self.trees.remove(ws_id, layout)
                ws_id, tree = self.trees.new_dir()
                layout, origin = None, None
        lid: str | None = None
        try:
            if layout is not None:
                pass  # mounted over its origin above
            elif overlay:
                lid, layer = self.layers.create()
                restore_tree(layer, snapshot, self.blobs)
                layout = Layout(Layering.OVERLAY, layers=(lid,), note="restored snapshot")
                self.trees.start(ws_id, layout)
                lid = None
            elif origin is not None:
                method = self.trees.copy(Path(origin), tree, what=f"copying {origin}")
                layout = Layout(Layering(method), origin=origin, note=self._overlay_reason or "")
            else:  # no overlay, no origin: the snapshot's paths, written out
                tree.mkdir()
                restore_tree(tree, snapshot, self.blobs)
                layout = Layout(Layering.COPY, note=self._overlay_reason or "")
        except BaseException:
            if lid is not None:
                self.layers.discard(lid)
            remove_path(tree.parent)
            raise
        ws = self._finish(ws_id, layout, snapshot)
        if origin is not None:
            try:
                ws.restore(snapshot)
            except BaseException:
                ws.delete()
                raise
        return ws

    def open(self, ws_id: str) -> Workspace:
        """Reattach to an existing workspace by id (mounting its overlay again if it is not mounted)."""
        meta = self.root / "ws" / ws_id / "meta.json" if _ID_RE.fullmatch(ws_id) else None
        if meta is None or not meta.exists():
            raise WorkspaceError(f"no workspace {ws_id!r} in {self.root}")
        obj = json.loads(meta.read_text())
        layout = Layout.from_json(obj)
        base = self.load_snapshot(obj["base"])
        tree = meta.parent / "tree"
        if layout.layering is Layering.OVERLAY and not is_mountpoint(tree):
            try:
                self.trees.mount(ws_id, layout)
            except (OverlayError, LayerError) as exc:
                raise WorkspaceError(f"cannot mount workspace {ws_id}: {exc}") from None
        return Workspace(ws_id, tree, self, base, layout)

    # -- operations on workspaces (Workspace.fork and .delete call these)
    def fork(self, parent: Workspace) -> Workspace:
        """A new workspace at ``parent``'s current state, sharing its base (see :meth:`Workspace.fork`)."""
        ws_id, tree = self.trees.new_dir()
        layout = parent.layout
        if layout.layering is not Layering.OVERLAY:
            try:
                method = self.trees.copy(parent.root, tree, what="forking a workspace")
            except BaseException:
                remove_path(tree.parent)
                raise
            return self._finish(ws_id, Layout(Layering(method), origin=layout.origin, note=layout.note),
                                parent._base)
        try:
            child = self.trees.fork_layout(parent.root, layout)
        except BaseException:
            remove_path(tree.parent)
            raise
        try:
            self.trees.start(ws_id, child)
        except BaseException:
            remove_path(tree.parent)
            self.layers.release([lid for lid in child.layers if lid not in layout.layers], ws_id)
            raise
        return self._finish(ws_id, child, parent._base)

    def delete(self, ws: Workspace) -> None:
        """Unmount and remove ``ws`` and release its layers (idempotent)."""
        if not (self.root / "ws" / ws.id).exists():
            return
        self.trees.remove(ws.id, ws.layout)

    def unmount(self, ws: Workspace) -> list[str]:
        """Unmount ``ws``'s tree now (synchronously; lazily if busy); it stays (:meth:`open`
        mounts it again). For a process sharing the store with others (``flywheel acp``) that
        is done with its own workspaces. Returns the mountpoints."""
        if ws.layout.layering is not Layering.OVERLAY or not (self.root / "ws" / ws.id).exists():
            return []
        return detach_under(self.root / "ws" / ws.id)

    def unmount_all(self) -> list[str]:
        """Unmount every workspace tree of this store now (synchronously; a busy one lazily), whoever
        mounted it; the workspaces stay (:meth:`open` mounts one again). For a process done with the
        store (a server's shutdown, a rollout runner's close) and, at start, for the mounts a killed
        process left (only where this process owns the store: a server under its data directory's
        lock). Returns the mountpoints."""
        return detach_under(self.root / "ws")

    # -- snapshots
    def save_snapshot(self, snapshot: Snapshot) -> None:
        dest = self.root / "snapshots" / f"{snapshot.id}.json"
        if not dest.exists():
            tmp = dest.with_name(f".tmp-{secrets.token_hex(8)}")
            tmp.write_bytes(snapshot.to_json())
            os.replace(tmp, dest)

    def import_snapshot(self, snapshot: Snapshot, source: BlobStore | None) -> None:
        """Make ``snapshot`` restorable from this store: copy the bytes of each file this
        store lacks from ``source`` (another store's blobs; streamed and hash-checked),
        then save the manifest. A file in neither raises :class:`MissingBlob`."""
        for path, entry in snapshot.manifest.items():
            if entry.kind is not EntryKind.FILE or entry.sha256 is None or self.blobs.has(entry.sha256):
                continue
            if source is None or not source.has(entry.sha256):
                raise MissingBlob(path, entry.sha256)
            fd = os.open(source.path(entry.sha256), os.O_RDONLY | os.O_CLOEXEC)
            try:
                self.blobs.put_fd(fd, entry.size, entry.sha256, path)
            finally:
                os.close(fd)
        self.save_snapshot(snapshot)

    def load_snapshot(self, snapshot_id: str) -> Snapshot:
        if not _HEX64_RE.fullmatch(snapshot_id):
            raise SnapshotError(f"not a snapshot id: {snapshot_id!r}")
        try:
            raw = (self.root / "snapshots" / f"{snapshot_id}.json").read_bytes()
        except FileNotFoundError:
            raise SnapshotError(f"no snapshot {snapshot_id} in {self.root}") from None
        return Snapshot.from_json(raw, expected_id=snapshot_id)

