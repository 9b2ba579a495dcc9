"""What re-execution costs with semantic_search on, with and without a recorded search.

A real app (SQLite log, semantic_search on as deployed) records two sessions
on the same small tree: one that only reads a file, one that also calls
``semantic_search``. Each is then re-executed (``POST .../reexecute``), the
non-searching one first, in one fresh process. Reported per re-execution: wall
time, growth of the process's peak RSS, and whether the embedding model was
loaded. Before the session factory gave replays a lazily built index, every
re-execution built a full index (loading the embedder) even when the session
never searched: measured with this script on the code before the change
(f207d14), on 2 loaded cores, 26.3 s and +620 MB peak RSS; now 0.04 s and
+0 MB, embedder not loaded (results/replay_index.json).

Not measured: the model load inside a searching re-execution (recording that
session loaded the embedder already, and peak RSS is a high-water mark, so
its ``peak_rss_growth_mb`` is not comparable); trees larger than a few files
(the index build grows with the tree).

Usage: python benchmarks/replay_index.py [--quick]   (the measurement is small already:
--quick runs the same, written to results/replay_index_quick.json)
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import write_result

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(quick: bool = False) -> None:
    from fastapi.testclient import TestClient

    from agent.parser import encode_call as call
    from backend.app import create_app
    from backend.db.engine import make_engine, migrate
    from backend.db.log import SessionLog
    from backend.settings import Settings

    with tempfile.TemporaryDirectory(prefix="fw-replay-index-") as tmp_s:
        tmp = Path(tmp_s)
        src = tmp / "src"
        src.mkdir()
        (src / "app.py").write_text("def add(a, b):\n    return a - b\n")
        (src / "stats.py").write_text("def mean(xs):\n    return sum(xs) / len(xs)\n")
        db = f"sqlite:///{tmp / 'fw.db'}"
        engine = make_engine(db)
        migrate(engine)
        token = SessionLog(engine).create_token("bench", "staff")
        engine.dispose()
        settings = Settings(data_dir=tmp / "data", db_url=db, allowed_roots=[src], port=0)
        h = {"Authorization": f"Bearer {token}"}
        with TestClient(create_app(settings)) as client:
            hub = client.app.state.flywheel.hub  # type: ignore[attr-defined]
            hub.indexes.wait_s = 300.0  # the recorded search waits for its build

            def record(outputs: list[str]) -> str:
                r = client.post("/v1/sessions", headers=h, json={
                    "workspace": {"path": str(src)}, "policy": {"kind": "scripted", "outputs": outputs}})
                sid = r.json()["id"]
                client.post(f"/v1/sessions/{sid}/messages", headers=h, json={"text": "go"})
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline:
                    events = client.get(f"/v1/sessions/{sid}/events?limit=5000", headers=h).json()["events"]
                    if any(e["type"] == "turn_end" for e in events):
                        return sid
                    time.sleep(0.05)
                raise SystemExit("a recorded turn did not end")

            def reexecute(sid: str) -> dict[str, Any]:
                before, t0 = peak_rss_mb(), time.perf_counter()
                report = client.post(f"/v1/sessions/{sid}/reexecute", headers=h).json()
                return {"wall_s": round(time.perf_counter() - t0, 3),
                        "peak_rss_growth_mb": round(peak_rss_mb() - before, 1),
                        "embedder_loaded": hub.indexes._embedder is not None, "counts": report["counts"]}

            plain = record([call("read_file", {"path": "app.py"}), "it subtracts"])
            no_search = reexecute(plain)
            # recording this one loads the embedder (for the live index), so its re-execution
            # measures the replay's own full index build, not the model load
            with_search = reexecute(record([call("semantic_search", {"query": "average of a list"}), "found it"]))
    result = {
        "reexecute_without_search": no_search,
        "reexecute_with_search": with_search,
        "pass": (not no_search["embedder_loaded"] and with_search["embedder_loaded"]
                 and no_search["counts"]["same"] == 1 and with_search["counts"]["same"] == 1),
    }
    write_result("replay_index", result, quick=quick)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smoke run, written to replay_index_quick.json")
    main(ap.parse_args().quick)
