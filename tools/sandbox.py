"""Run shell commands for the agent: bubblewrap isolation plus cgroup limits.

:class:`BubblewrapSandbox` is the one production path. Each command runs as
``bash -c COMMAND`` (``sh`` where bash is missing) with:

* the host root mounted read-only, only the workspace writable (bound at its
  own path), a private ``/tmp`` (tmpfs, discarded after the call, counted
  against the memory limit), a fresh ``/dev``, a fresh *read-only* ``/proc``
  (so ``/proc/sys`` and ``/proc/sysrq-trigger`` cannot be written), and
  ``/run`` hidden (service sockets: mysqld, postgres, dbus, docker);
* every namespace unshared: no network but an isolated loopback, its own PID
  namespace (when its pid 1 dies the kernel kills every process in it);
* no capabilities (``--cap-drop ALL`` when we are root);
* an empty environment except a small PATH, ``HOME=/tmp`` and ``LANG``;
* fresh cgroup v1 ``pids`` and ``memory`` groups joined *before* bwrap execs,
  so the whole tree is capped and can be swept; they are removed afterwards;
* a wall-clock timeout (SIGTERM, a short grace, then SIGKILL to the tree);
  cancelling :meth:`Sandbox.run` kills the tree too.

Not guaranteed:

* This is not a true security boundary against kernel exploits, a
  misconfigured host or a hostile bwrap binary; it keeps a confused or
  careless model from damaging the host and from reaching the network.
* When the backend runs as root, the command runs as host uid 0 (without
  capabilities, in a user namespace). Whatever host uid 0 may open through a
  writable mount or a filesystem Unix socket outside the hidden paths is
  reachable (the network namespace does not cover filesystem sockets). Run
  the backend as an unprivileged user for a stronger boundary.
* Everything outside the workspace is *readable* (minus hidden paths):
  do not put secrets on the host filesystem where the sandbox can read them.
* No disk quota: a command can fill the workspace's filesystem. No CPU quota
  beyond the timeout.
* Without writable cgroups, memory falls back to ``ulimit -v`` (address
  space, which breaks some runtimes that reserve large virtual ranges) and
  the number of processes is not capped; ``enforced`` on the result says so.
* Output beyond ``SandboxLimits.kill_output_bytes`` (1 GiB by default) kills
  the command; below that, everything is read and only head and tail kept.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol, runtime_checkable

from tools.cgroups import CgroupGroup, CgroupV1
from tools.supervisor import supervise

log = logging.getLogger(__name__)

UNSAFE_ENV_VAR = "FLYWHEEL_UNSAFE_NO_SANDBOX"
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_LAUNCHER_FAILED = 125
_warned: set[str] = set()
_probe_cache: dict[str, str | None] = {}


class SandboxUnavailable(RuntimeError):
    """No working sandbox and the operator did not opt out of isolation."""


@dataclass(slots=True)
class SandboxLimits:
    """Per-command limits. ``output_bytes`` is what is *kept* (head + tail);
    ``kill_output_bytes`` (None: never) kills a command that prints more."""

    timeout_s: float = 60.0
    memory_bytes: int = 1 << 30
    max_pids: int = 256
    output_bytes: int = 64 << 10
    kill_output_bytes: int | None = 1 << 30

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.memory_bytes <= 0 or self.max_pids <= 0:
            raise ValueError(f"limits must be positive: {self}")
        if self.output_bytes < 0 or (self.kill_output_bytes or 0) < 0:
            raise ValueError(f"output limits must not be negative: {self}")


@dataclass(slots=True)
class CommandResult:
    """Outcome of one command. All fields are JSON-serialisable.

    ``exit_code`` is None when the launcher was killed by a signal (then
    ``signal`` is set). Inside bwrap a command that dies of signal N is seen as
    exit code 128+N, which is how bwrap reports it. ``oom_killed`` is best
    effort. ``enforced`` names the mechanism behind each limit, or ``"none"``.
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


@runtime_checkable
class Sandbox(Protocol):
    """Runs one shell command with ``cwd`` (the workspace root) writable."""

    async def run(
        self, command: str, cwd: Path, limits: SandboxLimits | None = None
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
        self, command: str, cwd: Path, limits: SandboxLimits | None = None
    ) -> CommandResult:
        limits = limits or SandboxLimits()
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
            )
            oom = group.oom_killed()
        finally:
            group.kill_sync()
            group.remove()
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


DEFAULT_HIDDEN: tuple[Path, ...] = (Path("/run"),)
"""Hidden unless the caller says otherwise: where services put their sockets."""


def _isolation_args(bwrap: str) -> list[str]:
    """The bwrap flags every sandbox gets, before any workspace-specific mount."""
    args = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    args += ["--remount-ro", "/proc", "--tmpfs", "/tmp"]
    args += ["--unshare-all", "--die-with-parent", "--new-session"]
    if os.geteuid() == 0:  # as root, bwrap would keep every capability
        args += ["--cap-drop", "ALL"]
    return args


def _cover(path: Path) -> list[str]:
    """Hide a directory behind an empty tmpfs, anything else behind /dev/null."""
    if path.is_dir():
        return ["--tmpfs", str(path)]
    return ["--ro-bind", "/dev/null", str(path)]


class BubblewrapSandbox(_CgroupRunner):
    """Commands in bubblewrap (see the module docstring for what that holds).

    ``hide``: host directories replaced by an empty tmpfs inside the sandbox
    (files: by an empty read-only file), e.g. the workspace store root so
    sibling workspaces are invisible; they come on top of ``hide_defaults``. The workspace itself stays visible even
    when it lies beneath a hidden directory; a hidden directory *inside* the
    workspace is covered after the workspace is bound. Paths that do not
    exist on the host are skipped.
    """

    _isolation: ClassVar[dict[str, str]] = {"filesystem": "bwrap", "network": "bwrap"}
    _term_spares_launcher: ClassVar[bool] = True

    def __init__(
        self,
        *,
        bwrap: str = "bwrap",
        hide: Sequence[Path] = (),
        hide_defaults: Sequence[Path] = DEFAULT_HIDDEN,
        cgroups: CgroupV1 | None = None,
        kill_grace_s: float = 1.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(cgroups, kill_grace_s)
        self.bwrap = shutil.which(bwrap) or bwrap
        hidden = {Path(os.path.realpath(h)) for h in (*hide_defaults, *hide)}
        self.hide = tuple(sorted(hidden, key=lambda p: (len(p.parts), str(p))))
        # No .pyc files in the workspace: they would clutter every diff.
        self.env = {"PATH": SAFE_PATH, "HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}

    def _argv(self, command: str, cwd: Path) -> list[str]:
        if cwd == Path("/"):
            raise ValueError("refusing to make the whole filesystem writable (cwd is /)")
        w = str(cwd)
        existing = [h for h in self.hide if h.exists() and h != cwd]
        argv = _isolation_args(self.bwrap)
        for h in existing:
            if not h.is_relative_to(cwd):
                argv += _cover(h)
        argv += ["--bind", w, w]
        for h in existing:
            if h.is_relative_to(cwd):
                argv += _cover(h)
        argv += ["--chdir", w, "--clearenv"]
        for key, value in self.env.items():
            argv += ["--setenv", key, value]
        return [*argv, "--", self.shell, "-c", command]


class UnsandboxedRunner(_CgroupRunner):
    """Plain subprocess in ``cwd``: NO filesystem or network isolation.

    For operators who explicitly opt out (no bubblewrap on the host). It keeps
    the timeout, the output cap and, where cgroups are writable, the memory and
    process limits and the tree kill; the command inherits this process's
    environment and can read and write anything this user can.
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
            argv = [*_isolation_args(path), "--", "true"]
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
    environ: Mapping[str, str] | None = None,
) -> Sandbox:
    """The sandbox to use: bubblewrap if it works here, else refuse (fail closed).

    ``allow_unsandboxed`` (or ``FLYWHEEL_UNSAFE_NO_SANDBOX=1`` in ``environ``,
    default ``os.environ``) turns the refusal into an :class:`UnsandboxedRunner`.
    """
    environ = os.environ if environ is None else environ
    allow_unsandboxed = allow_unsandboxed or environ.get(UNSAFE_ENV_VAR) == "1"
    reason = probe_bwrap(bwrap)
    if reason is None:
        return BubblewrapSandbox(bwrap=bwrap, hide=hide)
    if not allow_unsandboxed:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not available: apt-get install bubblewrap, or start with "
            f"--unsafe-no-sandbox to run commands without isolation ({reason})"
        )
    return UnsandboxedRunner()
