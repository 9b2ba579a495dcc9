"""A small OpenAI-compatible server for tests: streams scripted outputs over real HTTP.

It is the counterpart of ``OpenAICompatPolicy`` (a real server on loopback,
real SSE framing), not a mock of the client.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ScriptedChatServer:
    """``models``: the entries ``GET /v1/models`` lists (None: no such route, a 404), answered
    after ``models_delay_s`` (on the server's thread). ``requests`` are the POSTs;
    ``model_lists`` counts the GETs."""

    def __init__(self, outputs: Sequence[str], *, chunk_chars: int = 7, status: int = 200,
                 api_key: str | None = None, models: list[dict] | None = None, models_delay_s: float = 0.0):
        self.outputs = list(outputs)
        self.chunk_chars = chunk_chars
        self.status = status
        self.api_key = api_key
        self.models = models
        self.models_delay_s = models_delay_s
        self.requests: list[dict] = []
        self.model_lists = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:
                server.model_lists += 1
                if self.path != "/v1/models" or server.models is None:
                    return self._json(404, {"error": {"message": "not found"}})
                time.sleep(server.models_delay_s)
                self._json(200, {"object": "list", "data": server.models})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
                if server.api_key and self.headers.get("Authorization") != f"Bearer {server.api_key}":
                    return self._json(401, {"error": {"message": "bad key"}})
                if server.status != 200:
                    return self._json(server.status, {"error": {"message": "scripted failure"}})
                if self.path not in ("/v1/chat/completions", "/v1/completions"):
                    return self._json(404, {"error": {"message": "not found"}})
                chat = self.path == "/v1/chat/completions"
                text = server.outputs.pop(0) if server.outputs else ""
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for i in range(0, len(text), server.chunk_chars):
                    piece = text[i : i + server.chunk_chars]
                    if chat:
                        self._event({"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
                    else:  # completions, with Flywheel's token-in/token-out extension fields
                        ids = [ord(c) for c in piece]
                        self._event({"choices": [{"index": 0, "text": piece, "finish_reason": None, "token_ids": ids,
                                                  "logprobs": {"token_logprobs": [-0.5] * len(ids)}}]})
                self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                self._event({"choices": [], "usage": {"completion_tokens": max(1, len(text) // 3)}})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

            def _event(self, data: dict) -> None:
                self.wfile.write(b"data: " + json.dumps(data).encode() + b"\n\n")
                self.wfile.flush()

            def _json(self, status: int, data: dict) -> None:
                payload = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    @contextmanager
    def running(self) -> Iterator[ScriptedChatServer]:
        thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.httpd.shutdown()
            self.httpd.server_close()
            thread.join(5)
