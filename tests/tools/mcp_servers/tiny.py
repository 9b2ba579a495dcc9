"""A tiny MCP server for the client tests, on the official SDK's MCPServer (stdio).

Tools: add, echo (with an optional list), slow (sleeps), picture (image content),
fail (raises: an error result), die (the process exits), big (N bytes of text),
counter (how many times it was called in this process).
"""

import base64
import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image

app = MCPServer("tiny")
CALLS = {"counter": 0}


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool()
def echo(text: str, tags: list[str] | None = None) -> str:
    """Echo the text back, then the tags joined by commas."""
    return text + ("" if not tags else " " + ",".join(tags))


@app.tool()
def slow(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return f"slept {seconds}"


@app.tool()
def picture() -> Image:
    """A 1x1 PNG."""
    return Image(data=base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="),
        format="png")


@app.tool()
def fail(why: str) -> str:
    """Always fails."""
    raise ToolError(f"failing on purpose: {why}")


@app.tool()
def die() -> str:
    """The server process exits at once."""
    print("tiny: exiting on request", file=sys.stderr, flush=True)
    os._exit(3)


@app.tool()
def big(n: int) -> str:
    """n bytes of text."""
    return "x" * n


@app.tool()
def counter() -> str:
    """How many times this tool was called."""
    CALLS["counter"] += 1
    return f"call {CALLS['counter']}"


if __name__ == "__main__":
    print(f"tiny: pid {os.getpid()}", file=sys.stderr, flush=True)
    app.run("stdio")
