"""Per-command cgroup v1 groups (``pids`` + ``memory``) for the sandbox.

Each sandboxed command gets a fresh group in every controller we can write,
created as a child of *this* process's own group (read from
``/proc/self/cgroup``), so limits set on us by whoever started us still apply
and nothing is left in a hierarchy we do not own once the group is removed.

Not guaranteed:

* cgroup v2 (unified) hierarchies are not handled here; on a v2-only host
  :meth:`CgroupV1.discover` finds no controllers and the sandbox falls back.
* Killing reads ``cgroup.procs`` and then signals each pid. A pid can exit and
  be reused between the read and the kill (v1 has no ``cgroup.kill``); inside
  the bubblewrap sandbox the PID namespace makes the real teardown atomic, the
  sweep here is the second line.
* ``oom_killed`` is best effort: it needs ``oom_kill`` in ``memory.oom_control``
  (Linux >= 4.13), else it guesses from ``memory.failcnt``.
"""

from __future__ import annotations

import logging
import os
import signal
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

CONTROLLERS = ("pids", "memory")


@dataclass(slots=True)
class CgroupGroup:
    """One command's groups: controller name → group directory."""

    dirs: dict[str, Path]
    enforced: dict[str, str] = field(default_factory=dict)

    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs.values()]

    def pids(self) -> set[int]:
        """Every pid currently in any of the groups (empty once all exited)."""
        found: set[int] = set()
        for procs in self.procs_files():
            try:
                text = procs.read_text()
            except OSError:
                continue
            found.update(int(tok) for tok in text.split())
        return found

    def signal_all(self, sig: int, exclude: Iterable[int] = ()) -> int:
        """Send ``sig`` to every pid in the groups except ``exclude``; return the count."""
        skip = set(exclude)
        sent = 0
        for pid in self.pids() - skip:
            try:
                os.kill(pid, sig)
                sent += 1
            except (ProcessLookupError, PermissionError):
                pass
        return sent

    def oom_killed(self) -> bool:
        mem = self.dirs.get("memory")
        if mem is None:
            return False
        try:
            for line in (mem / "memory.oom_control").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value) > 0
            return int((mem / "memory.failcnt").read_text().strip() or "0") > 0
        except (OSError, ValueError):
            return False

    def remove(self) -> bool:
        """Remove the (empty) group directories; True when all are gone."""
        ok = True
        for d in self.dirs.values():
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                ok = False
                log.error("could not remove cgroup %s: %s", d, exc)
        return ok

    def kill_sync(self, exclude: Iterable[int] = ()) -> None:
        """SIGKILL everything in the groups (one pass, no waiting)."""
        self.signal_all(signal.SIGKILL, exclude)


class CgroupV1:
    """Finds writable cgroup v1 controllers and makes per-command groups.

    ``parents`` maps a controller to the directory under which groups are
    created; :meth:`discover` fills it from ``/proc/self/cgroup`` and
    ``/proc/self/mountinfo``. ``prefix`` names the groups (tests use a unique
    one to check that nothing is left behind).
    """

    def __init__(self, parents: dict[str, Path], prefix: str = "flywheel-") -> None:
        self.parents = dict(parents)
        self.prefix = prefix

    @classmethod
    def disabled(cls) -> CgroupV1:
        """No controllers: every limit falls back (for tests and unusual hosts)."""
        return cls({})

    @classmethod
    def discover(
        cls,
        prefix: str = "flywheel-",
        proc_self: Path = Path("/proc/self"),
    ) -> CgroupV1:
        own = _own_groups(proc_self / "cgroup")
        parents: dict[str, Path] = {}
        for mount_root, mount_point, controllers in _v1_mounts(proc_self / "mountinfo"):
            for ctl in CONTROLLERS:
                if ctl not in controllers or ctl in parents or ctl not in own:
                    continue
                rel = os.path.relpath(own[ctl], mount_root)
                if rel.startswith(".."):
                    continue
                parent = Path(mount_point) / rel if rel != "." else Path(mount_point)
                if parent.is_dir():
                    parents[ctl] = parent
        return cls(parents, prefix)

    def create(self, *, memory_bytes: int | None, max_pids: int | None) -> CgroupGroup:
        """Make fresh groups and set limits. Controllers that fail are left out.

        ``enforced`` on the result says which limits hold (``"cgroup"``);
        a controller missing from it is not enforced by a cgroup.
        """
        name = f"{self.prefix}{uuid.uuid4().hex[:16]}"
        group = CgroupGroup(dirs={})
        for ctl, parent in self.parents.items():
            d = parent / name
            try:
                d.mkdir()
            except OSError as exc:
                log.debug("cannot create cgroup %s: %s", d, exc)
                continue
            group.dirs[ctl] = d
            try:
                if ctl == "pids" and max_pids is not None:
                    (d / "pids.max").write_text(str(max_pids))
                    group.enforced["pids"] = "cgroup"
                elif ctl == "memory" and memory_bytes is not None:
                    (d / "memory.limit_in_bytes").write_text(str(memory_bytes))
                    group.enforced["memory"] = "cgroup"
                    try:  # swap too, where swap accounting exists
                        (d / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                    except OSError:
                        pass
            except OSError as exc:
                log.debug("cannot set %s limit in %s: %s", ctl, d, exc)
        return group


def _own_groups(path: Path) -> dict[str, str]:
    """controller → this process's group path, from ``/proc/self/cgroup``."""
    own: dict[str, str] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return own
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[1]:
            continue
        for ctl in parts[1].split(","):
            own[ctl] = parts[2]
    return own


def _v1_mounts(path: Path) -> list[tuple[str, str, set[str]]]:
    """(mount root, mount point, controllers) of every cgroup v1 mount."""
    mounts: list[tuple[str, str, set[str]]] = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return mounts
    for line in lines:
        pre, sep, post = line.partition(" - ")
        if not sep:
            continue
        fields, tail = pre.split(), post.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] != "cgroup":
            continue
        mounts.append((fields[3], fields[4], set(tail[2].split(","))))
    return mounts
