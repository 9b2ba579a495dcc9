"""benchmarks/_pyspy.py: py-spy's raw samples become shares per server part; a real --profile run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _pyspy  # noqa: E402
from tests.benchmarks.test_load_crash_smoke import run_quick  # noqa: E402

RAW = """\
_run_module_as_main (<frozen runpy>:198);Runner.run (asyncio/runners.py:118);_serve.<locals>.pump_events (backend/api/ws.py:196);_serve.<locals>.send (backend/api/ws.py:187);WebSocketsSansIOProtocol.send (/x/site-packages/uvicorn/protocols/websockets/websockets_sansio_impl.py:506) 30
Thread._bootstrap (threading.py:1002);EventWriter._loop (backend/db/writer.py:205);DefaultDialect.do_executemany (/x/site-packages/sqlalchemy/engine/default.py:1189) 10
Runner.run (asyncio/runners.py:118);Executor._invoke (agent/executor.py:252);spawn_piped (tools/spawn.py:115);Popen._execute_child (subprocess.py:1898) 20
Runner.run (asyncio/runners.py:118) 40
not a sample line
"""


def test_summarise_names_the_parts_and_the_top_functions() -> None:
    s = _pyspy.summarise(RAW, top=2)
    assert s["samples"] == 100
    assert s["parts_percent"] == {
        "commit: the event writer thread (group commit, SQLAlchemy Core)": 10.0,
        "tools: starting ripgrep": 20.0,  # before "tools: running calls", which also matches the stack
        "websocket: sending events": 30.0,
        "event loop and other": 40.0,
    }
    assert s["top_own_time_percent"] == {
        "Runner.run (asyncio/runners.py)": 40.0,
        "WebSocketsSansIOProtocol.send (uvicorn/protocols/websockets/websockets_sansio_impl.py)": 30.0,
    }
    assert _pyspy.summarise("")["samples"] == 0


def _can_profile() -> bool:
    try:
        _pyspy.find_pyspy()
    except SystemExit:
        return False
    return os.geteuid() == 0 or Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip() == "0"


@pytest.mark.benchmark_smoke
@pytest.mark.timeout(60)
@pytest.mark.skipif(not _can_profile(), reason="needs py-spy and the right to ptrace (root or ptrace_scope 0)")
def test_load_quick_profile_reports_where_the_server_spends_its_cpu(tmp_path: Path) -> None:
    r = run_quick("load.py", tmp_path, "--profile")
    assert r["errors"] == 0 and r["server_cpu_ms_per_event"] > 0
    p = r["profile"]
    assert p["samples"] > 0 and abs(sum(p["parts_percent"].values()) - 100) < 1
    assert p["thread_cpu_s"]["event_loop_thread"] > 0
