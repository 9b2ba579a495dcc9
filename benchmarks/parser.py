"""Parser throughput and dispatch latency.

Feeds 10 KB, 1 MB and 10 MB model responses (prose, code and tool calls with
raw code bodies) in random 1–64-byte chunks; reports MB/s and the linearity
ratio (max/min time per MB across sizes; target ≤ 1.5). Then measures dispatch
latency: from feeding the closing tag's last byte to the tool starting, through
the real validator and executor (target p99 < 1 ms).

Usage: python benchmarks/parser.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Mapping
from typing import Any

from _common import median, percentile, write_result

from agent.calls import validate_call
from agent.executor import Executor
from agent.parser import ParsedCall, StreamParser, encode_call
from tools.base import ParamSpec, ParamType, Resources, ToolContext, ToolResult, ToolSpec

CODE = '''def compare(a, b):
    """Return -1, 0 or 1 (uses <, > and & freely)."""
    if a < b and (a & 1) == 0:
        return -1
    return 1 if a > b else 0  # ]]> is fine too
'''


def make_response(size: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    parts: list[str] = []
    n = 0
    i = 0
    while n < size:
        if rng.random() < 0.5:
            piece = "Let me check how a < b compares & why it matters. " * rng.randint(1, 4) + "\n"
        else:
            piece = encode_call("edit_file", {"path": f"src/m{i}.py", "search": CODE, "replace": CODE.replace("-1", "-2")}) + "\n"
            i += 1
        parts.append(piece)
        n += len(piece)
    return "".join(parts)[:size]


def chunked(text: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(text):
        k = rng.randint(1, 64)
        out.append(text[i : i + k])
        i += k
    return out


def feed_all(chunks: list[str]) -> int:
    p = StreamParser()
    calls = 0
    for c in chunks:
        for e in p.feed(c):
            calls += isinstance(e, ParsedCall)
    p.finish()
    return calls


def throughput(sizes: list[int], repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for size in sizes:
        text = make_response(size)
        chunks = chunked(text, size)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            feed_all(chunks)
            times.append(time.perf_counter() - t0)
        best = min(times)
        mb = len(text.encode()) / 1e6
        out[str(size)] = {"bytes": len(text.encode()), "chunks": len(chunks), "seconds": best,
                          "mb_per_s": mb / best, "s_per_mb": best / mb}
    per_mb = [v["s_per_mb"] for v in out.values()]
    return {"sizes": out, "linearity_ratio": max(per_mb) / min(per_mb)}


class Probe:
    spec = ToolSpec("probe", "records when it starts", (ParamSpec("i", ParamType.INTEGER, "n"),))

    def __init__(self) -> None:
        self.started: dict[int, float] = {}

    def resources(self, args: Mapping[str, Any]) -> Resources:
        return Resources(reads=frozenset({str(args["i"])}))

    async def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        self.started[args["i"]] = time.perf_counter()
        return ToolResult(True, "")


async def dispatch_latency(n: int) -> dict[str, float]:
    probe = Probe()
    specs = {"probe": probe.spec}
    lat: list[float] = []
    for i in range(n):
        parser = StreamParser()
        ex = Executor({"probe": probe}, ToolContext(workspace=None))
        text = "thinking... " + encode_call("probe", {"i": str(i)})
        for ch in chunked(text[:-1], i):
            parser.feed(ch)
        t0 = time.perf_counter()
        for ev in parser.feed(text[-1]):  # the closing tag's last byte
            if isinstance(ev, ParsedCall):
                ex.submit(validate_call(ev, specs, f"c{i}"))
        await ex.results()
        lat.append((probe.started[i] - t0) * 1e3)
    return {"p50_ms": median(lat), "p99_ms": percentile(lat, 99), "max_ms": max(lat), "n": n}


class TimedPolicy:
    """Streams a response in chunks and notes when it handed out the chunk that
    completes each call, so dispatch is measured through the real Session."""

    name = "timed"

    def __init__(self, text: str, cut: int):
        self.text, self.cut = text, cut
        self.handed_at = 0.0

    async def stream(self, prompt):  # noqa: ANN001, ANN201
        from agent.policy import PolicyChunk

        yield PolicyChunk(self.text[: self.cut])
        self.handed_at = time.perf_counter()
        yield PolicyChunk(self.text[self.cut :])  # the closing tag's last byte, then more text

    async def aclose(self) -> None:
        pass


async def session_dispatch_latency(n: int) -> dict[str, float]:
    import tempfile
    from pathlib import Path

    from agent.events import ListSink
    from agent.runtime import SessionParts, build_session
    from agent.session import Limits
    from tools.workspace import WorkspaceStore

    probe = Probe()
    lat: list[float] = []
    with tempfile.TemporaryDirectory(prefix="fw-parser-bench-") as tmp:
        (Path(tmp) / "src").mkdir()
        parts = SessionParts(workspace=WorkspaceStore(Path(tmp) / "store").from_dir(Path(tmp) / "src"))
        for i in range(n):
            call = encode_call("probe", {"i": str(i)})
            text = "thinking... " + call + " and the model keeps writing" * 20
            policy = TimedPolicy(text, len("thinking... ") + len(call) - 1)
            # tools=[probe]: the instrumented tool replaces the derived set (the factory's benchmark seam)
            session = build_session(parts, policy=policy, tools=[probe], sink=ListSink(), limits=Limits(max_steps=1))
            await session.run_turn("go")
            lat.append((probe.started[i] - policy.handed_at) * 1e3)
    return {"p50_ms": median(lat), "p99_ms": percentile(lat, 99), "max_ms": max(lat), "n": n,
            "measured": "policy hands out the chunk holding the closing tag's last byte -> tool starts, "
                        "through Session (parser, validation, events, executor)"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller sizes (for a smoke run)")
    args = ap.parse_args()
    sizes = [10_000, 100_000, 1_000_000] if args.quick else [10_000, 1_000_000, 10_000_000]
    result = throughput(sizes, repeats=3 if not args.quick else 1)
    result["dispatch"] = asyncio.run(dispatch_latency(300 if args.quick else 2000))
    result["session_dispatch"] = asyncio.run(session_dispatch_latency(200 if args.quick else 1000))
    result["targets"] = {"linearity_ratio_max": 1.5, "dispatch_p99_ms_max": 1.0}
    result["pass"] = (result["linearity_ratio"] <= 1.5 and result["dispatch"]["p99_ms"] < 1.0
                      and result["session_dispatch"]["p99_ms"] < 1.0)
    write_result("parser", result)


if __name__ == "__main__":
    main()
