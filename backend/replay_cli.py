"""``flywheel replay``: view, re-execute or branch a recorded session over REST.

Not guaranteed: the view shows events as recorded; it does not pace them in
real time.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import httpx

from agent.events import event_from_json_or_none
from backend.settings import DEFAULT_SERVER, ClientSettings, SettingsError, load_settings
from backend.transcript import Transcript


class ReplayError(Exception):
    pass


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay", help="view, re-execute or branch a recorded session",
        description="Without options: print the session's events in order with their timing. "
        "--reexecute: restore its starting workspace, feed the recorded model outputs through the same "
        "tools and report, call by call, what differs. --from-step K --policy P: continue from step K "
        "with another policy, as a new session.",
    )
    p.add_argument("session_id")
    p.add_argument("--server", help=f"server URL (env FLYWHEEL_SERVER, default {DEFAULT_SERVER})")
    p.add_argument("--token", help="API token (env FLYWHEEL_TOKEN)")
    p.add_argument("--reexecute", action="store_true")
    p.add_argument("--from-step", type=int, metavar="K", help="branch after the first K model calls")
    p.add_argument("--policy", help='policy for the branch: JSON such as {"kind": "openai"}, or "demo"')
    p.add_argument("--json", action="store_true", help="print the raw JSON answer")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except ReplayError as exc:
        print(f"flywheel replay: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    try:
        client = load_settings(ClientSettings)  # FLYWHEEL_SERVER, FLYWHEEL_TOKEN
    except SettingsError as exc:
        raise ReplayError(str(exc)) from None
    server = (args.server or client.server).rstrip("/")
    token = args.token or client.token
    if not token:
        raise ReplayError("no token: pass --token or set FLYWHEEL_TOKEN")
    if (args.from_step is None) != (args.policy is None):
        raise ReplayError("--from-step and --policy go together")
    client = httpx.Client(base_url=server, headers={"Authorization": f"Bearer {token}"}, timeout=600)
    sid = args.session_id
    with client:
        if args.from_step is not None:
            data = _call(client, "POST", f"/v1/sessions/{sid}/branch",
                         {"from_step": args.from_step, "policy": _policy(args.policy)})
            if args.json:
                print(json.dumps(data))
            else:
                print(f"branched: new session {data['id']} (from step {args.from_step} of {sid})")
                print(f"follow it with: flywheel chat --server {server} --session {data['id']}")
            return 0
        if args.reexecute:
            report = _call(client, "POST", f"/v1/sessions/{sid}/reexecute")
            print(json.dumps(report) if args.json else render_report(report))
            return 0
        events = _call(client, "GET", f"/v1/sessions/{sid}/timeline")
        if args.json:
            for e in events:
                print(json.dumps(e))
            return 0
        show = Transcript(sys.stdout)
        for e in events:
            event = event_from_json_or_none(json.dumps({k: v for k, v in e.items() if k != "t"}))
            if event is not None and e["type"] in ("user_message", "tool_call_started", "turn_end"):
                print(f"\n[+{e['t']:.3f}s #{e['seq']}]", end=" ")
            if event is not None:
                show(event)
        return 0


def _policy(raw: str) -> dict[str, Any]:
    if raw == "demo":
        from backend.chat import demo_policy

        return demo_policy()
    try:
        policy = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ReplayError(f"--policy is not valid JSON: {exc}") from None
    if not isinstance(policy, dict):
        raise ReplayError("--policy must be a JSON object")
    return policy


def _call(client: httpx.Client, method: str, path: str, body: Any = None) -> Any:
    try:
        r = client.request(method, path, json=body)
    except httpx.HTTPError as exc:
        raise ReplayError(f"cannot reach {client.base_url}: {exc}") from None
    if r.status_code >= 400:
        try:
            detail = r.json().get("detail")
        except ValueError:
            detail = r.text[:300]
        raise ReplayError(f"{method} {path}: HTTP {r.status_code}: {detail}")
    return r.json()


def render_report(report: dict[str, Any]) -> str:
    c = report["counts"]
    lines = [f"re-executed {report['session_id']}: {c['same']} same, {c['differs']} differ, "
             f"{c['missing']} missing, {c['extra']} extra"
             + (f", {c['recorded']} from the recording (external tools are not run again)" if c.get("recorded") else "")]
    for call in report["calls"]:
        lines.append(f"  {call['status']:8} {call['call_id']:12} {call['name']}")
        if call["status"] == "differs":
            lines.append(f"    recorded: {str(call['recorded_output'])[:200]!r}")
            lines.append(f"    now:      {str(call['replayed_output'])[:200]!r}")
    return "\n".join(lines)
