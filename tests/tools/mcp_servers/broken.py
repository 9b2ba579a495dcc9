"""An MCP server that misbehaves, written on raw JSON-RPC lines (no SDK), for the client tests.

It completes the initialize handshake, then lists: ``hang`` (never answers), ``garbage``
(answers with a line that is not JSON, then nothing), ``bad_result`` (a result whose
content is not a list), ``crash`` (exits), ``ok`` (answers properly), and two tools whose
schema is not JSON Schema (``bad_schema``). With ``--bad-list`` its tools/list answer itself is
malformed (a tool's properties are not an object).
"""

import json
import sys

TOOLS = [
    {"name": "hang", "description": "never answers", "inputSchema": {"type": "object"}},
    {"name": "garbage", "description": "answers garbage", "inputSchema": {"type": "object"}},
    {"name": "bad_result", "description": "malformed result", "inputSchema": {"type": "object"}},
    {"name": "crash", "description": "exits", "inputSchema": {"type": "object"}},
    {"name": "ok", "description": "works", "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}}},
    {"name": "bad_schema", "description": "schema is not JSON Schema",
     "inputSchema": {"type": "object", "properties": {"x": {"type": "nonsense"}}}},
]
BAD_LIST = [{"name": "not_object", "description": "properties are not an object",
             "inputSchema": {"type": "object", "properties": 7}}]


def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    msg = json.loads(line)
    method, mid = msg.get("method"), msg.get("id")
    if mid is None:
        continue  # notifications
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {
            "protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
            "serverInfo": {"name": "broken", "version": "0"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": mid, "result": {"tools": BAD_LIST if "--bad-list" in sys.argv else TOOLS}})
    elif method == "tools/call":
        name = msg["params"]["name"]
        if name == "garbage":
            sys.stdout.write("this is not JSON-RPC\n")
            sys.stdout.flush()
        elif name == "bad_result":
            send({"jsonrpc": "2.0", "id": mid, "result": {"content": 5}})
        elif name == "crash":
            print("broken: crashing", file=sys.stderr, flush=True)
            sys.exit(4)
        elif name == "ok":
            send({"jsonrpc": "2.0", "id": mid, "result": {
                "content": [{"type": "text", "text": "fine " + msg["params"].get("arguments", {}).get("x", "")}]}})
        # hang: no answer at all
    else:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": f"no method {method}"}})
