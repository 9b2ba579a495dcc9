"""Run shell commands for the agent: bubblewrap isolation plus cgroup limits.

:class:`BubblewrapSandbox` is the one production path. Each command runs as
``bash -c COMMAND`` (``sh`` where bash is missing) with:

* an allow-listed, read-only view of the host (``/usr``, ``/bin``, ``/lib*``,
  ``/etc`` minus every entry other users may not read; see
  :mod:`tools.bwrap`), the workspace bound read-write at ``/workspace``
  (whatever its host path) as the working directory, a private ``/tmp``
  (tmpfs, discarded after the call, counted against the memory limit), a
  fresh ``/dev`` and a fresh *read-only* ``/proc``. The host's ``/root``,
  ``/home``, ``/var``, ``/tmp``, ``/run``, the workspace store and every other
  workspace do not exist inside;
* every namespace unshared: no network but an isolated loopback, its own PID
  namespace (when its pid 1 dies the kernel kills every process in it), the
  hostname ``flywheel``;
* no capabilities (``--cap-drop ALL`` when we are root);
* an empty environment except a small PATH, ``HOME=/tmp`` and ``LANG``;
* fresh cgroup v1 ``pids`` and ``memory`` groups joined *before* bwrap execs,
  so the whole tree is capped and can be swept; they are removed afterwards;
* ``RLIMIT_FSIZE`` (``SandboxLimits.file_bytes``): no file can grow past it;
* a total disk cap (``SandboxLimits.disk_bytes``) checked after the command
  by walking the workspace; an over-cap workspace fails the call;
* a wall-clock timeout (SIGTERM, a short grace, then SIGKILL to the tree);
  cancelling :meth:`Sandbox.run` kills the tree too.

Not guaranteed:

* This is not a true security boundary against kernel exploits, a
  misconfigured host or a hostile bwrap binary; it keeps a confused or
  careless model from damaging the host, reading its secrets and reaching
  the network.
* When the backend runs as root, the command runs as host uid 0 (without
  capabilities, in a user namespace). It can open what host uid 0 may open
  *through the visible paths*: world-readable files, plus anything an
  ``extra_ro`` directory holds (those are not scanned for secrets).
* The disk cap is not a quota: a command is not stopped when the workspace
  passes ``disk_bytes``; it can write up to ``file_bytes`` into each of many
  files until it ends or times out, and the call is then reported as failed
  (the files stay: the model is told to delete them). ``/tmp`` is bounded by
  the memory limit only. The check walks the whole workspace after every
  command (``benchmarks/sandbox.py``: 45 ms for 5000 files on a loaded 2-core
  host); ``disk_bytes=None`` turns it off where a real quota exists.
* No CPU quota beyond the timeout.
* Host paths can still be learnt from ``/proc/self/mountinfo``; timestamps,
  inode numbers and ``/etc`` differ between hosts (see :mod:`tools.bwrap`).
* Without writable cgroups, memory falls back to ``ulimit -v`` (address
  space, which breaks some runtimes that reserve large virtual ranges) and
  the number of processes is not capped; ``enforced`` on the result says so.
* Output beyond ``SandboxLimits.kill_output_bytes`` (1 GiB by default) kills
  the command; below that, everything is read and only head and tail kept.
* :class:`UnsandboxedRunner` (``--unsafe-no-sandbox``) guarantees none of the
  isolation above, and commands see the workspace at its *host* path, so
  their output differs between copies of a workspace (replay and RL compare
  outputs that differ by path). It keeps the timeout, the output cap, the
  per-file and total disk caps and, where cgroups are writable, memory and
  process limits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol, runtime_checkable

from tools.argv import check_arg
from tools.bwrap import DEFAULT_VISIBLE, SCANNED, command_argv, isolation_args, unreadable_entries
from tools.cgroups import CgroupGroup, CgroupV1
from tools.disk_usage import tree_usage
from tools.supervisor import supervise

log = logging.getLogger(__name__)

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_LAUNCHER_FAILED = 125
_warned: set[str] = set()
_probe_cache: dict[str, str | None] = {}


class SandboxUnavailable(RuntimeError):
    """No working sandbox and the operator did not opt out of isolation."""


@dataclass(slots=True)
class SandboxLimits:
    """Per-command limits. ``output_bytes`` is what is *kept* (head + tail);
    ``kill_output_bytes`` (None: never) kills a command that prints more.

    ``file_bytes`` (None: no cap) is the largest file a command may write
    (``RLIMIT_FSIZE``, rounded down to 512 bytes: a write past it fails with
    EFBIG / "File size limit exceeded"). ``disk_bytes`` (None: not checked)
    caps the workspace's total allocated size, checked after the command.
    """

    timeout_s: float = 60.0
    memory_bytes: int = 1 << 30
    max_pids: int = 256
    output_bytes: int = 64 << 10
    kill_output_bytes: int | None = 1 << 30
    file_bytes: int | None = 256 << 20
    disk_bytes: int | None = 2 << 30

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.memory_bytes <= 0 or self.max_pids <= 0:
            raise ValueError(f"limits must be positive: {self}")
        if self.output_bytes < 0 or (self.kill_output_bytes or 0) < 0:
            raise ValueError(f"output limits must not be negative: {self}")
        if (self.file_bytes is not None and self.file_bytes < 512) or (
            self.disk_bytes is not None and self.disk_bytes <= 0
        ):
            raise ValueError(f"file_bytes must be at least 512 and disk_bytes positive: {self}")


@dataclass(slots=True)
class CommandResult:
    """Outcome of one command. All fields are JSON-serialisable.

    ``exit_code`` is None when the launcher was killed by a signal (then
    ``signal`` is set). Inside bwrap a command that dies of signal N is seen as
    exit code 128+N, which is how bwrap reports it. ``oom_killed`` is best
    effort. ``enforced`` names the mechanism behind each limit, or ``"none"``.
    ``workspace_bytes`` is the workspace's allocated size after the command
    (None when ``disk_bytes`` is not set); ``disk_limit_hit`` says it is over
    ``disk_bytes``.
    """

    exit_code: int | None
    signal: int | None
    duration_s: float
    timed_out: bool
    truncated: bool
    oom_killed: bool
    output: str
    output_bytes_total: int
    enforced: dict[str, str] = field(default_factory=dict)
    output_limit_hit: bool = False
    workspace_bytes: int | None = None
    disk_limit_hit: bool = False


@runtime_checkable
class Sandbox(Protocol):
    """Runs one shell command with ``cwd`` (the workspace root) writable.

    Raises :class:`tools.argv.ArgvError` (a ValueError) for a command that
    cannot be passed to a program (a NUL byte, over 128 KiB).

    ``on_output``, when given, receives the command's raw merged output as it
    is read (every byte, in order, before the result's head-and-tail cut);
    it is called on the event loop and must not block. Callers pass it only
    when they want live output, so an implementation written before it existed
    keeps working for everyone else.
    """

    async def run(
        self, command: str, cwd: Path, limits: SandboxLimits | None = None, *,
        on_output: Callable[[bytes], None] | None = None,
    ) -> CommandResult: ...


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


def _shell() -> str:
    return shutil.which("bash", path=SAFE_PATH) or "/bin/sh"


class _CgroupRunner:
    """Shared machinery: cgroup group per call, launcher, supervision, result."""

    _isolation: ClassVar[dict[str, str]] = {}
    _term_spares_launcher: ClassVar[bool] = False

    def __init__(self, cgroups: CgroupV1 | None, kill_grace_s: float) -> None:
        self._cgroups = cgroups if cgroups is not None else CgroupV1.discover()
        self.kill_grace_s = kill_grace_s
        self.shell = _shell()

    def _argv(self, command: str, cwd: Path) -> list[str]:
        raise NotImplementedError

    def _env(self) -> dict[str, str]:
        return {"PATH": SAFE_PATH, "LANG": "C.UTF-8"}

    async def run(
        self, command: str, cwd: Path, limits: SandboxLimits | None = None, *,
        on_output: Callable[[bytes], None] | None = None,
    ) -> CommandResult:
        limits = limits or SandboxLimits()
        check_arg("command", command)
        cwd = Path(os.path.realpath(cwd))
        if not cwd.is_dir():
            raise NotADirectoryError(f"workspace root is not a directory: {cwd}")
        group = self._cgroups.create(memory_bytes=limits.memory_bytes, max_pids=limits.max_pids)
        try:
            enforced = dict(self._isolation)
            launcher = self._launcher(group, limits, enforced)
            sup = await supervise(
                [*launcher, *self._argv(command, cwd)],
                cwd=cwd,
                env=self._env(),
                group=group,
                timeout_s=limits.timeout_s,
                kill_grace_s=self.kill_grace_s,
                output_bytes=limits.output_bytes,
                kill_output_bytes=limits.kill_output_bytes,
                term_spares_launcher=self._term_spares_launcher,
                on_output=on_output,
            )
            oom = group.oom_killed()
        finally:
            group.kill_sync()
            group.remove()
        usage = None
        if limits.disk_bytes is not None:
            usage = (await asyncio.to_thread(tree_usage, cwd)).bytes
        rc = sup.returncode
        return CommandResult(
            exit_code=rc if rc is not None and rc >= 0 else None,
            signal=-rc if rc is not None and rc < 0 else None,
            duration_s=round(sup.duration_s, 4),
            timed_out=sup.timed_out,
            truncated=sup.output.truncated,
            oom_killed=oom,
            output=sup.output.text(),
            output_bytes_total=sup.output.total,
            enforced=enforced,
            output_limit_hit=sup.output_limit_hit,
            workspace_bytes=usage,
            disk_limit_hit=usage is not None and limits.disk_bytes is not None and usage > limits.disk_bytes,
        )

    def _launcher(
        self, group: CgroupGroup, limits: SandboxLimits, enforced: dict[str, str]
    ) -> list[str]:
        """``sh -c`` prefix that joins the groups and sets fallbacks, then execs."""
        steps = [
            f"echo $$ > {shlex.quote(str(p))} || exit {_LAUNCHER_FAILED}"
            for p in group.procs_files()
        ]
        enforced["timeout"] = "kill process tree"
        if limits.file_bytes is not None:
            # POSIX sh counts ulimit -f in 512-byte blocks (bash does so only as sh).
            steps.append(f"ulimit -f {limits.file_bytes // 512} || exit {_LAUNCHER_FAILED}")
            enforced["file_size"] = "rlimit-fsize"
        enforced["disk"] = "checked after command" if limits.disk_bytes is not None else "none"
        enforced["pids"] = group.enforced.get("pids", "none")
        enforced["memory"] = group.enforced.get("memory", "none")
        if enforced["pids"] == "none":
            _warn_once("pids", "no writable cgroup v1 pids controller: process count NOT capped")
        if enforced["memory"] == "none":
            _warn_once("memory", "no writable cgroup v1 memory controller: using ulimit -v")
            kib = max(1, limits.memory_bytes // 1024)
            steps.append(f"ulimit -v {kib} || exit {_LAUNCHER_FAILED}")
            enforced["memory"] = "rlimit-as"
        script = "; ".join([*steps, 'exec "$@"'])
        return ["/bin/sh", "-c", script, "flywheel-launch"]


class BubblewrapSandbox(_CgroupRunner):
    """Commands in bubblewrap (see the module docstring for what that holds).

    ``visible``: host paths readable inside, at their own paths (default
    :data:`tools.bwrap.DEFAULT_VISIBLE`); ``extra_ro``: more of them, e.g. a
    toolchain directory. ``hide``: host paths covered by an empty, unopenable
    file or directory where they would otherwise be visible (beneath a
    visible path, or beneath the workspace); paths elsewhere are not visible
    in the first place. Entries of ``/etc`` that other users may not read are
    hidden too (scanned once, here).
    """

    _isolation: ClassVar[dict[str, str]] = {"filesystem": "bwrap", "network": "bwrap"}
    _term_spares_launcher: ClassVar[bool] = True

    def __init__(
        self,
        *,
        bwrap: str = "bwrap",
        hide: Sequence[Path] = (),
        visible: Sequence[Path] = DEFAULT_VISIBLE,
        extra_ro: Sequence[Path] = (),
        cgroups: CgroupV1 | None = None,
        kill_grace_s: float = 1.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(cgroups, kill_grace_s)
        self.bwrap = shutil.which(bwrap) or bwrap
        self.visible = (*visible, *(Path(p) for p in extra_ro))
        scanned = [e for root in SCANNED if any(root == v for v in visible) for e in unreadable_entries(root)]
        covered = sorted({Path(os.path.realpath(h)) for h in hide} | set(scanned), key=lambda p: (len(p.parts), str(p)))
        # A path beneath one already covered no longer exists inside: covering it would fail.
        self.hide = tuple(h for h in covered if not any(h != c and h.is_relative_to(c) for c in covered))
        # No .pyc files in the workspace: they would clutter every diff.
        self.env = {"PATH": SAFE_PATH, "HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}

    def _argv(self, command: str, cwd: Path) -> list[str]:
        return command_argv(bwrap=self.bwrap, workspace=cwd, visible=self.visible, covered=self.hide,
                            env=self.env, argv=[self.shell, "-c", command])


class UnsandboxedRunner(_CgroupRunner):
    """Plain subprocess in ``cwd``: NO filesystem or network isolation.

    For operators who explicitly opt out (no bubblewrap on the host). It keeps
    the timeout, the output cap, the per-file and total disk caps and, where
    cgroups are writable, the memory and process limits and the tree kill; the
    command inherits this process's environment and can read and write
    anything this user can. Not guaranteed: host-independent output. The
    command runs at the workspace's host path (there is no ``/workspace``),
    so ``pwd``, tracebacks and anything printing a path differ between two
    copies of a workspace.
    """

    _isolation: ClassVar[dict[str, str]] = {"filesystem": "none", "network": "none"}

    def __init__(self, *, cgroups: CgroupV1 | None = None, kill_grace_s: float = 1.0) -> None:
        super().__init__(cgroups, kill_grace_s)
        log.warning(
            "!!! UNSANDBOXED: commands from the model will run WITHOUT isolation, with full "
            "access to this machine's files and network as user %s. Use only on a disposable "
            "machine. !!!",
            os.geteuid(),
        )

    def _env(self) -> dict[str, str]:
        return dict(os.environ)

    def _argv(self, command: str, cwd: Path) -> list[str]:
        return [self.shell, "-c", command]


def probe_bwrap(bwrap: str = "bwrap") -> str | None:
    """None when ``bwrap`` can build our sandbox here, else why not (cached per path)."""
    if bwrap in _probe_cache:
        return _probe_cache[bwrap]
    path = shutil.which(bwrap)
    reason: str | None = None
    if path is None:
        reason = f"{bwrap!r} not found"
    else:
        try:
            argv = [*isolation_args(path, DEFAULT_VISIBLE), "--", "true"]
            proc = subprocess.run(argv, capture_output=True, timeout=10)
            if proc.returncode != 0:
                err = proc.stderr.decode(errors="replace").strip()
                reason = err or f"exit {proc.returncode}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            reason = str(exc)
    _probe_cache[bwrap] = reason
    return reason


def make_sandbox(
    *,
    allow_unsandboxed: bool = False,
    hide: Sequence[Path] = (),
    bwrap: str = "bwrap",
    extra_ro: Sequence[Path] = (),
) -> Sandbox:
    """The sandbox to use: bubblewrap if it works here, else refuse (fail closed).

    ``allow_unsandboxed`` turns the refusal into an :class:`UnsandboxedRunner`; the
    caller decides it (``backend.settings.LocalSettings.unsafe_no_sandbox``, read from
    ``FLYWHEEL_UNSAFE_NO_SANDBOX``): this module reads no environment variable.
    ``extra_ro`` directories are made readable inside the sandbox (e.g. a Python
    installation with pytest; commands find only ``/usr/bin/python3`` otherwise;
    the operator's ``FLYWHEEL_SANDBOX_EXTRA_RO``, ``LocalSettings.sandbox_extra_ro``).
    They are not scanned for secrets: name only toolchains.
    """
    extra = list(extra_ro)
    reason = probe_bwrap(bwrap)
    if reason is None:
        return BubblewrapSandbox(bwrap=bwrap, hide=hide, extra_ro=extra)
    if not allow_unsandboxed:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not available: apt-get install bubblewrap, or start with "
            f"--unsafe-no-sandbox to run commands without isolation ({reason})"
        )
    return UnsandboxedRunner()
