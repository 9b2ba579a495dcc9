"""Adversarial properties of the command sandbox. Every stress test is bounded."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import socket
import subprocess
import time
import tracemalloc
from pathlib import Path

import pytest

from tools.cgroups import CgroupV1
from tools.sandbox import (
    SAFE_PATH,
    BubblewrapSandbox,
    SandboxLimits,
    SandboxUnavailable,
    UnsandboxedRunner,
    make_sandbox,
    probe_bwrap,
)

# A python the sandbox can see (the venv may live under the host /tmp, which is hidden).
SANDBOX_PYTHON = shutil.which("python3", path=SAFE_PATH) or "python3"

_BWRAP_MISSING = probe_bwrap()
needs_bwrap = pytest.mark.skipif(
    _BWRAP_MISSING is not None,
    reason=f"bubblewrap unusable here ({_BWRAP_MISSING}): apt-get install bubblewrap",
)
pytestmark = pytest.mark.sandbox


@pytest.fixture
def cgroups() -> CgroupV1:
    """Real cgroups under a per-test prefix, so leftovers can be detected."""
    return CgroupV1.discover(prefix=f"flywheel-test-{secrets.token_hex(4)}-")


@pytest.fixture
def sandbox(cgroups: CgroupV1) -> BubblewrapSandbox:
    return BubblewrapSandbox(cgroups=cgroups, kill_grace_s=0.5)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


def leftover_groups(cgroups: CgroupV1) -> list[Path]:
    return [
        p
        for parent in cgroups.parents.values()
        for p in parent.iterdir()
        if p.name.startswith(cgroups.prefix)
    ]


def pids_with(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker`` (excluding this process)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry.name))
    return found


def unique_sleep() -> str:
    """A ``sleep`` argument no other process on the host will have."""
    return f"1000.{secrets.randbelow(10**6):06d}"


@needs_bwrap
@pytest.mark.parametrize("target", ["/etc/fw-probe", "/root/fw-probe", "/usr/fw-probe"])
async def test_writes_outside_workspace_fail(
    sandbox: BubblewrapSandbox, ws: Path, target: str
) -> None:
    r = await sandbox.run(f"echo pwned > {target}", ws)
    assert r.exit_code != 0
    assert not Path(target).exists()


@needs_bwrap
async def test_host_tmp_is_not_written(sandbox: BubblewrapSandbox, ws: Path) -> None:
    name = f"/tmp/flywheel-probe-{secrets.token_hex(6)}"
    r = await sandbox.run(f"echo x > {name} && cat {name}", ws)
    assert r.exit_code == 0 and r.output.strip() == "x"  # private /tmp is writable...
    assert not Path(name).exists()  # ...but is not the host's


@needs_bwrap
async def test_workspace_writes_persist(sandbox: BubblewrapSandbox, ws: Path) -> None:
    r = await sandbox.run("mkdir -p sub && printf 'kept' > sub/out.txt", ws)
    assert r.exit_code == 0
    assert (ws / "sub" / "out.txt").read_text() == "kept"


@needs_bwrap
async def test_tmp_is_discarded_between_calls(sandbox: BubblewrapSandbox, ws: Path) -> None:
    assert (await sandbox.run("echo x > /tmp/carry", ws)).exit_code == 0
    r = await sandbox.run("test -e /tmp/carry", ws)
    assert r.exit_code == 1


@needs_bwrap
async def test_host_sysctls_are_read_only(sandbox: BubblewrapSandbox, ws: Path) -> None:
    # Rewrites the current value (idempotent even if the write went through).
    before = Path("/proc/sys/kernel/core_pattern").read_text()
    r = await sandbox.run("cat /proc/sys/kernel/core_pattern > /proc/sys/kernel/core_pattern", ws)
    assert r.exit_code != 0 and "Read-only file system" in r.output
    assert Path("/proc/sys/kernel/core_pattern").read_text() == before


@needs_bwrap
@pytest.mark.parametrize("host_dir", ["/run", "/root", "/home", "/var", "/srv", "/opt", "/mnt", "/work"])
async def test_host_dirs_outside_the_allow_list_do_not_exist(
    sandbox: BubblewrapSandbox, ws: Path, host_dir: str
) -> None:
    r = await sandbox.run(f"ls -A {host_dir}", ws)
    assert r.exit_code == 2 and "No such file or directory" in r.output


def _connect_unix(path: Path) -> str:
    code = f"import socket; socket.socket(socket.AF_UNIX).connect({str(path)!r})"
    return f"{SANDBOX_PYTHON} -c \"{code}\" && echo CONNECTED"


@needs_bwrap
async def test_unix_socket_in_hidden_dir_is_unreachable(cgroups: CgroupV1, ws: Path) -> None:
    # Filesystem sockets pass through the network namespace: hiding is the defence.
    (ws / "open").mkdir()
    (ws / "hidden").mkdir()
    sb = BubblewrapSandbox(hide=[ws / "hidden"], cgroups=cgroups)
    with socket.socket(socket.AF_UNIX) as visible, socket.socket(socket.AF_UNIX) as hidden:
        for sock, path in ((visible, ws / "open" / "s"), (hidden, ws / "hidden" / "s")):
            sock.bind(str(path))
            sock.listen(8)
            sock.settimeout(0.3)
        control = await sb.run(_connect_unix(Path("open/s")), ws)
        assert "CONNECTED" in control.output  # the probe can detect a reachable socket
        r = await sb.run(_connect_unix(Path("hidden/s")), ws)
        assert "CONNECTED" not in r.output
        with pytest.raises(TimeoutError):
            hidden.accept()


@needs_bwrap
async def test_hidden_dir_inside_workspace_is_covered(cgroups: CgroupV1, ws: Path) -> None:
    (ws / ".private").mkdir()
    (ws / ".private" / "key").write_text("k3y")
    sb = BubblewrapSandbox(hide=[ws / ".private"], cgroups=cgroups)
    r = await sb.run("cat .private/key; echo visible > .private/new", ws)
    assert "k3y" not in r.output
    assert not (ws / ".private" / "new").exists()


@needs_bwrap
async def test_hidden_file_is_unreadable(cgroups: CgroupV1, ws: Path) -> None:
    (ws / "token").write_text("t0ken")
    sb = BubblewrapSandbox(hide=[ws / "token"], cgroups=cgroups)
    r = await sb.run("cat token; echo overwritten > token", ws)
    assert "t0ken" not in r.output and "Permission denied" in r.output
    assert (ws / "token").read_text() == "t0ken"


@needs_bwrap
async def test_endless_output_is_killed_at_the_hard_cap(
    sandbox: BubblewrapSandbox, ws: Path
) -> None:
    limits = SandboxLimits(output_bytes=1024, kill_output_bytes=8 << 20, timeout_s=30)
    r = await sandbox.run("yes", ws, limits)
    assert r.output_limit_hit and not r.timed_out and r.truncated
    assert 8 << 20 < r.output_bytes_total < 64 << 20
    assert r.duration_s < 10


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError):
        SandboxLimits(timeout_s=0)
    with pytest.raises(ValueError):
        SandboxLimits(max_pids=-1)


@needs_bwrap
async def test_hidden_sibling_workspaces_are_invisible(cgroups: CgroupV1, tmp_path: Path) -> None:
    store = tmp_path / "store"
    (store / "mine").mkdir(parents=True)
    (store / "other").mkdir()
    (store / "other" / "secret").write_text("s3cret")
    (store / "mine" / "own.txt").write_text("own")
    sb = BubblewrapSandbox(hide=[store], cgroups=cgroups)
    r = await sb.run(f"cat own.txt; ls {store}; cat {store}/other/secret", store / "mine")
    assert "own" in r.output
    assert "s3cret" not in r.output and "other" not in r.output.splitlines()
    assert r.exit_code != 0


@needs_bwrap
async def test_no_network_to_host_loopback(sandbox: BubblewrapSandbox, ws: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.settimeout(0.3)
        port = listener.getsockname()[1]
        py = (
            "import socket\ntry:\n    socket.create_connection(('127.0.0.1', %d), 2)\n"
            "    print('PY-CONNECTED')\nexcept OSError as e:\n    print('PY-REFUSED', e)\n" % port
        )
        (ws / "probe.py").write_text(py)
        script = f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo BASH-CONNECTED; {SANDBOX_PYTHON} probe.py; exit 0"
        r = await sandbox.run(script, ws, SandboxLimits(timeout_s=10))
        assert "PY-REFUSED" in r.output  # the probe really ran, and was refused
        assert "CONNECTED" not in r.output
        with pytest.raises(TimeoutError):
            listener.accept()


@needs_bwrap
async def test_no_route_to_outside(sandbox: BubblewrapSandbox, ws: Path) -> None:
    r = await sandbox.run("exec 3<>/dev/tcp/192.0.2.1/80", ws, SandboxLimits(timeout_s=10))
    assert r.exit_code != 0 and not r.timed_out  # unreachable at once, no hang


@needs_bwrap
async def test_fork_flood_is_capped_by_pids_max(sandbox: BubblewrapSandbox, ws: Path) -> None:
    flood = (
        "import os, time\n"
        "n = 0\n"
        "for _ in range(3000):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        continue\n"
        "    if pid == 0:\n"
        "        time.sleep(30); os._exit(0)\n"
        "    n += 1\n"
        "print('forked', n, flush=True)\n"
    )
    (ws / "flood.py").write_text(flood)
    limits = SandboxLimits(timeout_s=20, max_pids=48)
    r = await sandbox.run(f"{SANDBOX_PYTHON} flood.py", ws, limits)
    assert r.enforced["pids"] == "cgroup"
    assert not r.timed_out
    forked = int(r.output.split("forked", 1)[1].split()[0])
    assert 0 < forked < 48
    assert subprocess.run(["true"], timeout=10).returncode == 0  # host can still fork


@needs_bwrap
async def test_memory_hog_is_killed(sandbox: BubblewrapSandbox, ws: Path) -> None:
    hog = f"{SANDBOX_PYTHON} -c 'b = b\"x\" * (128 << 20); print(\"survived\")'"
    r = await sandbox.run(hog, ws, SandboxLimits(memory_bytes=64 << 20, timeout_s=20))
    assert r.enforced["memory"] == "cgroup"
    assert "survived" not in r.output
    assert r.oom_killed and r.exit_code != 0
    big = b"y" * (256 << 20)  # the host side can still allocate
    assert len(big) == 256 << 20


@needs_bwrap
async def test_sigterm_ignoring_command_dies_at_timeout(
    sandbox: BubblewrapSandbox, cgroups: CgroupV1, ws: Path
) -> None:
    marker = unique_sleep()
    command = f"trap '' TERM; sleep {marker}; echo never"
    r = await sandbox.run(command, ws, SandboxLimits(timeout_s=1.5))
    assert r.timed_out
    assert 1.5 <= r.duration_s < 1.5 + sandbox.kill_grace_s + 1.5
    assert "never" not in r.output
    assert pids_with(marker) == []
    assert leftover_groups(cgroups) == []


@needs_bwrap
async def test_huge_output_is_truncated_with_bounded_memory(
    sandbox: BubblewrapSandbox, ws: Path
) -> None:
    cap = 4096
    limits = SandboxLimits(output_bytes=cap, timeout_s=30)
    tracemalloc.start()
    try:
        r = await sandbox.run("head -c 100000000 /dev/zero | tr '\\0' x", ws, limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.exit_code == 0 and not r.timed_out
    assert r.truncated and r.output_bytes_total == 100_000_000
    assert f"[... {100_000_000 - cap} bytes truncated ...]" in r.output
    assert r.output.count("x") == cap
    assert peak < 8 << 20  # far below the 100 MB that went through


@needs_bwrap
async def test_background_process_does_not_outlive_call(
    sandbox: BubblewrapSandbox, cgroups: CgroupV1, ws: Path
) -> None:
    marker = unique_sleep()
    r = await sandbox.run(f"sleep {marker} & echo started", ws)
    assert r.exit_code == 0 and r.output.strip() == "started"
    assert r.duration_s < 5
    assert pids_with(marker) == []
    assert leftover_groups(cgroups) == []


@needs_bwrap
async def test_cancellation_kills_the_tree(
    sandbox: BubblewrapSandbox, cgroups: CgroupV1, ws: Path
) -> None:
    marker = unique_sleep()
    task = asyncio.create_task(sandbox.run(f"sleep {marker}", ws, SandboxLimits(timeout_s=60)))
    deadline = time.monotonic() + 10
    while not pids_with(marker):
        assert time.monotonic() < deadline, "command never started"
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pids_with(marker) == []
    assert leftover_groups(cgroups) == []


@needs_bwrap
@pytest.mark.parametrize("round_", range(4))
async def test_a_killed_shell_never_runs_its_next_command(
    sandbox: BubblewrapSandbox, ws: Path, round_: int
) -> None:
    # Killing the tree must be one step: not sleep first, then (a moment
    # later) the shell, which would meanwhile write the file.
    task = asyncio.create_task(sandbox.run("sleep 5; echo late > late.txt", ws, SandboxLimits(timeout_s=60)))
    await asyncio.sleep(0.15 + 0.01 * round_)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.05)
    assert not (ws / "late.txt").exists()


@needs_bwrap
async def test_exit_code_duration_and_merged_output(
    sandbox: BubblewrapSandbox, ws: Path
) -> None:
    r = await sandbox.run("echo out; echo err >&2; sleep 0.2; exit 7", ws)
    assert r.exit_code == 7 and r.signal is None and not r.timed_out
    assert r.output == "out\nerr\n"
    assert 0.2 <= r.duration_s < 5
    assert r.enforced == {
        "filesystem": "bwrap",
        "network": "bwrap",
        "timeout": "kill process tree",
        "pids": "cgroup",
        "memory": "cgroup",
        "file_size": "rlimit-fsize",
        "disk": "checked after command",
    }


@needs_bwrap
async def test_environment_is_cleared(
    sandbox: BubblewrapSandbox, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLYWHEEL_TEST_SECRET", "hunter2")
    r = await sandbox.run("env", ws)
    assert "hunter2" not in r.output
    assert "HOME=/tmp" in r.output.splitlines()


@needs_bwrap
async def test_without_cgroups_the_fallback_is_recorded(ws: Path) -> None:
    sb = BubblewrapSandbox(cgroups=CgroupV1.disabled())
    r = await sb.run("echo ok", ws)
    assert r.exit_code == 0 and r.output == "ok\n"
    assert r.enforced["pids"] == "none" and r.enforced["memory"] == "rlimit-as"


async def test_unsandboxed_runner_warns_and_runs(
    cgroups: CgroupV1, ws: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="tools.sandbox"):
        runner = UnsandboxedRunner(cgroups=cgroups)
    assert any("UNSANDBOXED" in rec.getMessage() for rec in caplog.records)
    r = await runner.run("pwd; exit 3", ws)
    assert r.exit_code == 3 and r.output.strip() == str(ws.resolve())
    assert r.enforced["filesystem"] == "none" and r.enforced["network"] == "none"


async def test_unsandboxed_runner_kills_background_jobs(cgroups: CgroupV1, ws: Path) -> None:
    marker = unique_sleep()
    r = await UnsandboxedRunner(cgroups=cgroups).run(f"sleep {marker} & echo started", ws)
    assert r.output.strip() == "started" and r.duration_s < 5
    assert pids_with(marker) == []


def test_make_sandbox_refuses_without_bwrap() -> None:
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        make_sandbox(bwrap="/nonexistent/bwrap")


def test_make_sandbox_opt_out_gives_unsandboxed_runner() -> None:
    missing = "/nonexistent/bwrap"
    assert isinstance(make_sandbox(bwrap=missing, allow_unsandboxed=True), UnsandboxedRunner)
    # the switch is the caller's argument (backend.settings.LocalSettings), never this module's env read
    with pytest.MonkeyPatch.context() as mp, pytest.raises(SandboxUnavailable):
        mp.setenv("FLYWHEEL_UNSAFE_NO_SANDBOX", "1")
        make_sandbox(bwrap=missing)


@needs_bwrap
def test_make_sandbox_prefers_bubblewrap() -> None:
    assert isinstance(make_sandbox(), BubblewrapSandbox)


@needs_bwrap
async def test_on_output_gets_every_byte_as_it_comes(sandbox: BubblewrapSandbox, ws: Path) -> None:
    seen: list[tuple[float, bytes]] = []
    t0 = time.monotonic()
    limits = SandboxLimits(output_bytes=1024)
    r = await sandbox.run("echo first; sleep 0.5; head -c 200000 /dev/zero | tr '\\0' x", ws, limits,
                          on_output=lambda b: seen.append((time.monotonic() - t0, b)))
    assert r.exit_code == 0 and r.truncated and r.output_bytes_total == 200006
    assert b"".join(b for _, b in seen) == b"first\n" + b"x" * 200000  # all of it, past the kept cap
    assert seen[0][1].startswith(b"first") and seen[0][0] < 0.45  # before the command went on


@needs_bwrap
async def test_a_failing_output_listener_does_not_stop_the_command(sandbox: BubblewrapSandbox, ws: Path) -> None:
    def broken(_: bytes) -> None:
        raise RuntimeError("display broke")

    r = await sandbox.run("echo a; echo b", ws, on_output=broken)
    assert r.exit_code == 0 and r.output == "a\nb\n"
