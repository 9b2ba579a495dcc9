"""The web app in a real browser (Debian's headless Chromium via Playwright) against a real
``flywheel serve`` subprocess and database (PostgreSQL when reachable, else SQLite), measured with the
browser's Performance API:

* first load on a warm server: navigation start to the sign-in form on screen, and (signed in: the
  token already in the tab's sessionStorage) to the app's navigation on screen; p50 and max of
  ``--loads`` fresh tabs (targets: < 1 s);
* a 5,000-event recording (``--events``) opening in replay: from setting ``#/replay/ID`` in a loaded
  app to the frame after the timeline and the transcript show the last event (target < 2 s), split
  into the server's part (until the log's last byte arrived) and the app's (fold, layout, paint);
  the recording is seeded through the RL rollout log (``backend.rl_log``), the path real rollouts take;
* streaming: a live scripted turn that emits one character per ``assistant_delta`` as fast as the
  server produces them (the rate is measured from the log: the target needs >= 200 events/s), then
  two tool calls, watched in the chat; frames counted with ``requestAnimationFrame`` while it
  streams: mean fps, the worst 1-second window (target >= ~30), frames over 50 ms, long tasks. Then
  the same session opened in a new tab, where its whole log arrives as one burst: the time from the
  socket opening to the last event on screen, as events/s.

Headless Chromium without a GPU paints in software, so these are conservative for a desktop browser;
the machine is shared, so compare figures from one run.

Usage: python benchmarks/web_app.py [--events 5000] [--loads 5] [--stream-s 8] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, percentile, write_result

sys.path.insert(0, str(ROOT))

from agent.parser import encode_call  # noqa: E402
from tests.web import harness  # noqa: E402

READY_JS = """(sel) => {
  window.__ready = null;
  const seen = () => { if (window.__ready === null && document.querySelector(sel)) window.__ready = performance.now(); };
  new MutationObserver(seen).observe(document, {subtree: true, childList: true});
}"""


def first_loads(browser: Any, srv: harness.WebServer, n: int) -> dict[str, Any]:
    out: dict[str, list[float]] = {"sign_in_form_ms": [], "signed_in_app_ms": [], "dom_content_loaded_ms": []}
    for signed_in in (False, True):
        for _ in range(n):
            ctx = browser.new_context(viewport={"width": 1400, "height": 900})
            page = ctx.new_page()
            sel = "nav.top" if signed_in else "#token"
            page.add_init_script(f"({READY_JS})({sel!r});")
            if signed_in:
                page.add_init_script(f"sessionStorage.setItem('flywheel.token', {srv.staff!r});")
            page.goto(f"{srv.url}/")
            page.wait_for_selector(sel)
            ready = page.evaluate("window.__ready")
            dcl = page.evaluate("performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd")
            out["signed_in_app_ms" if signed_in else "sign_in_form_ms"].append(ready)
            if not signed_in:
                out["dom_content_loaded_ms"].append(dcl)
            ctx.close()
    return {k: {"p50": round(statistics.median(v), 1), "max": round(max(v), 1), "runs": len(v)} for k, v in out.items()}


def seed_recording(srv: harness.WebServer, n_events: int) -> str:
    """An RL rollout of ``n_events`` events: steps of 8 parallel calls (reads, commands with output,
    an edit), recorded through the rollout log like a real one."""
    from agent import events as ev
    from backend.rl_log import RLSessionLog
    from tools.workspace import WorkspaceStore

    rl = RLSessionLog(srv.log, WorkspaceStore(srv.proc.data_dir / "workspaces"))
    run = f"bench{int(time.time())}"
    rl.record_run({"name": run}, run_id=run)
    sid = f"{run}big"
    rl.create_session(session_id=sid, run_id=run, iteration=1, task_id="big", sample=0)
    out: list[Any] = [ev.UserMessage(text="A long task."), ev.TurnStarted()]
    t, step = 0.0, 0
    while len(out) < n_events - 1:
        step += 1
        for w in range(3):
            out.append(ev.AssistantDelta(step=step, text=f"Step {step}, part {w}: looking at more files. "))
        for i in range(8):
            cid = f"t1s{step}c{i}"
            name = "run_command" if i % 4 == 3 else "edit_file" if i == 7 else "read_file"
            args = {"command": f"pytest -q tests/test_{i}.py"} if name == "run_command" else {"path": f"src/m{i}.py"}
            out.append(ev.ToolCallDelta(step=step, index=i, name=name, param=next(iter(args)), text=next(iter(args.values()))))
            out.append(ev.ToolCallStarted(step=step, index=i, call_id=cid, name=name, args=args))
            if name == "run_command":
                out.append(ev.ToolOutputDelta(step=step, index=i, call_id=cid, text="....F..\n"))
            out.append(ev.ToolResultEvent(step=step, index=i, call_id=cid, name=name, ok=i != 3,
                                          output=f"     1\tdef f{i}():\n     2\t    return {i}\n", duration_ms=5.0 + 40 * i))
        out.append(ev.FileEditEvent(call_id=f"t1s{step}c2", path="src/m2.py",
                               diff=f"--- a/src/m2.py\n+++ b/src/m2.py\n@@ -1,2 +1,2 @@\n def f2():\n-    return {step}\n+    return {step + 1}\n"))
        out.append(ev.AssistantMessage(step=step, text="…", output_tokens=120))
    out = out[: n_events - 1] + [ev.TurnEnd(reason="completed", steps=step, output_tokens=120 * step)]
    t0 = time.time() - len(out) * 0.05
    rows = []
    for i, e in enumerate(out, 1):
        t += 0.05 if e.type != "tool_result" else 0.02
        rows.append(e.model_copy(update={"seq": i, "session_id": sid, "turn": 1, "ts": t0 + t}).model_dump(mode="json"))
    for k in range(0, len(rows), 1000):
        rl.append_events(sid, rows[k:k + 1000])
    rl.finish(sid, reward=1.0, status="finished")
    return sid


def replay_open(page: Any, srv: harness.WebServer, sid: str, n: int, repeats: int) -> dict[str, Any]:
    """Open the recording ``repeats`` times; split each into the server's part (until the last byte of
    the log arrived, Resource Timing) and the app's (folding, laying out and painting it)."""
    total, server, app = [], [], []
    for _ in range(repeats):
        page.goto(f"{srv.url}/#/")
        page.wait_for_selector("nav.top")
        page.evaluate("performance.clearResourceTimings()")
        ms, t0 = page.evaluate("""([id, n]) => new Promise((resolve) => {
          const t0 = performance.now();
          location.hash = '#/replay/' + id;
          const check = () => {
            const p = document.querySelector('.position');
            if (p && p.textContent.startsWith(`event ${n}/${n}`) && document.querySelector('.timeline .bar.call'))
              requestAnimationFrame(() => resolve([performance.now() - t0, t0]));
            else setTimeout(check, 2);
          };
          check();
        })""", [sid, n])
        arrived = page.evaluate("Math.max(...performance.getEntriesByType('resource').filter(r => r.name.includes('/v1/'))"
                                ".map(r => r.responseEnd))")
        total.append(ms)
        server.append(arrived - t0)
        app.append(ms - (arrived - t0))
    bars = page.locator(".timeline .bar.call").count()
    med = lambda v: round(statistics.median(v), 1)  # noqa: E731
    return {"events": n, "p50_ms": med(total), "max_ms": round(max(total), 1), "runs": repeats, "call_bars": bars,
            "server_p50_ms": med(server), "app_p50_ms": med(app), "app_max_ms": round(max(app), 1)}


def frame_stats(page: Any, start: float, end: float) -> dict[str, Any]:
    frames = [f for f in page.evaluate("window.__frames") if start <= f <= end]
    intervals = [b - a for a, b in zip(frames, frames[1:], strict=False)]
    windows = [sum(1 for f in frames if w <= f < w + 1000) for w in frames if w + 1000 <= end]
    longs = page.evaluate("window.__long")
    return {
        "watched_s": round((end - start) / 1000, 2), "fps_mean": round(len(frames) / max((end - start) / 1000, 1e-9), 1),
        "fps_worst_1s": min(windows) if windows else None,
        "frame_interval_p95_ms": round(percentile(intervals, 95), 1) if intervals else None,
        "frames_over_50ms": sum(i > 50 for i in intervals), "long_tasks": len(longs),
        "long_task_max_ms": round(max(longs), 1) if longs else 0.0,
    }


COUNT_FRAMES = """() => {
  window.__frames = []; window.__long = []; window.__stop = false;
  const loop = (t) => { window.__frames.push(t); if (!window.__stop) requestAnimationFrame(loop); };
  requestAnimationFrame(loop);
  try { new PerformanceObserver((l) => window.__long.push(...l.getEntries().map((e) => e.duration)))
          .observe({type: 'longtask'}); } catch (e) {}
}"""


def streaming(browser: Any, srv: harness.WebServer, seconds: float) -> dict[str, Any]:
    """A live turn streaming one character per event as fast as the server produces them, then the
    same session opened again in a new tab (its whole log arrives as one burst)."""
    chars = int(250 * seconds)
    text = ("Streaming one character per event to see whether the chat keeps up. " * (chars // 60 + 1))[:chars]
    outputs = [text + "\n\n" + "\n".join(encode_call("read_file", {"path": p}) for p in ("stats.py", "README.md")),
               "Done."]
    s = srv.create_session(outputs, token=srv.staff, chunk_chars=1, delay_s=0.0, title="stream")
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    page = ctx.new_page()
    page.add_init_script(f"sessionStorage.setItem('flywheel.token', {srv.staff!r});")
    page.goto(f"{srv.url}/#/chat/{s['id']}")
    page.wait_for_selector(".conn[data-state='open']")
    page.evaluate(COUNT_FRAMES)
    page.fill("#prompt", "Stream.")
    page.keyboard.press("Enter")
    page.wait_for_selector(".msg.assistant")
    start = page.evaluate("performance.now()")
    page.wait_for_selector(".turn-end.reason-completed", timeout=int(seconds * 20_000) + 60_000)
    end = page.evaluate("window.__stop = true, performance.now()")
    live = frame_stats(page, start, end)
    complete = page.locator(".msg.assistant .text").first.inner_text() == text.strip()
    ctx.close()
    events = srv.events(s["id"])
    deltas = [e for e in events if e["type"] == "assistant_delta"]
    span = deltas[-1]["ts"] - deltas[0]["ts"] if len(deltas) > 1 else 0.0
    live.update({"events": len(events), "server_events_per_s": round(len(deltas) / span, 1) if span else None,
                 "text_complete": complete})

    # the same log again, as a backlog: every event arrives at once when the socket opens
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    page = ctx.new_page()
    page.add_init_script(f"sessionStorage.setItem('flywheel.token', {srv.staff!r});")
    page.add_init_script(f"({COUNT_FRAMES})();")
    page.add_init_script("""(() => {
      window.__open = null; window.__done = null;
      new MutationObserver(() => {
        if (window.__open === null && document.querySelector(".conn[data-state='open']")) window.__open = performance.now();
        if (window.__done === null && document.querySelector('.turn-end.reason-completed')) window.__done = performance.now();
      }).observe(document, {subtree: true, childList: true, attributes: true});
    })();""")
    page.goto(f"{srv.url}/#/chat/{s['id']}")
    page.wait_for_selector(".turn-end.reason-completed", timeout=120_000)
    page.wait_for_timeout(100)
    opened, done = page.evaluate("[window.__open, window.__done]")
    start = min(opened, done)  # the first events can land in the frame that shows the socket open
    burst = frame_stats(page, start, done + 1)
    burst["socket_open_to_all_shown_ms"] = round(done - start, 1)
    burst["events_per_s"] = round(len(events) / max((done - start) / 1000, 1e-3), 1)
    burst["text_complete"] = page.locator(".msg.assistant .text").first.inner_text() == text.strip()
    ctx.close()
    return {"live": live, "backlog": burst}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").strip(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--stream-s", type=float, default=8.0)
    parser.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite",
                        help="the server's database (default: SQLite, what `flywheel serve` uses out of the box)")
    parser.add_argument("--quick", action="store_true", help="1,000 events, 2 loads, 3 s of streaming")
    args = parser.parse_args()
    if args.quick:
        args.events, args.loads, args.stream_s = 1000, 2, 3.0
    reason = harness.missing()
    if reason:
        sys.exit(f"web_app benchmark: {reason}")
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="fw-webbench-") as tmp, harness.web_server(Path(tmp), db=args.db) as srv:
        with sync_playwright() as p:
            browser = harness.launch(p)
            # warm the server: a signed-in load (the first requests build the schema, open the DB)
            warm = browser.new_context()
            wp = warm.new_page()
            wp.add_init_script(f"sessionStorage.setItem('flywheel.token', {srv.staff!r});")
            wp.goto(f"{srv.url}/")
            wp.wait_for_selector("nav.top")
            time.sleep(0.5)
            warm.close()
            loads = first_loads(browser, srv, args.loads)
            sid = seed_recording(srv, args.events)
            ctx = browser.new_context(viewport={"width": 1400, "height": 900})
            page = ctx.new_page()
            page.add_init_script(f"sessionStorage.setItem('flywheel.token', {srv.staff!r});")
            replay = replay_open(page, srv, sid, args.events, 3)
            ctx.close()
            stream = streaming(browser, srv, args.stream_s)
            browser.close()
        db = "postgresql" if srv.db_url.startswith("postgresql") else "sqlite"
    result = {
        "quick": args.quick, "database": db, "chromium": harness.CHROMIUM,
        "first_load": loads, "replay_open": replay, "streaming": stream,
        "targets": {"first_load_ms": 1000, "replay_open_ms": 2000, "streaming_fps": 30},
        "met": {
            "first_load": loads["signed_in_app_ms"]["max"] < 1000 and loads["sign_in_form_ms"]["max"] < 1000,
            "replay_open": replay["max_ms"] < 2000,
            # the browser's side: no second of the live stream under 30 fps, and a backlog far above
            # 200 events/s drawn at >= 30 fps (the live rate itself is the server's, reported above)
            "streaming": (stream["live"]["fps_worst_1s"] or 0) >= 30 and stream["live"]["frames_over_50ms"] == 0
                         and stream["backlog"]["events_per_s"] >= 200,
        },
    }
    write_result("web_app", result, quick=args.quick)


if __name__ == "__main__":
    main()
