"""(query, chunk) training pairs for the embedder, from evidence of what an agent needed.

A pair says "for this query, this chunk was what the agent needed". This module
turns *evidence* (lines of a file an agent read or edited, the queries it was
answering, the file's text at that moment) into pairs by chunking the file with
the same chunker the index uses and keeping the chunks that overlap those lines.
Where the evidence comes from is not this package's business: it is described
by the :class:`Evidence` protocol (``agent.trajectories.Evidence`` reads it from
recorded sessions), so ``embeddings/`` imports none of our other packages.

Rules:

* the chunks overlapping the lines, the most specific only (a class summary
  around the method that was read is dropped);
* evidence that touches more than ``max_chunks`` chunks (e.g. a whole file) is
  not a specific signal and gives no pairs;
* without the file's text, the evidence's ``window`` (what the session showed)
  becomes one ``window`` chunk;
* one pair per (session, query, chunk content); blank chunks give none.

Not guaranteed: a file the chunker fails on gives no pairs (silently, by design:
one bad file must not stop a training-data run).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from embeddings.types import Chunk

Chunker = Callable[[str, str], list[Chunk]]


class Evidence(Protocol):
    """Lines of a file an agent read or edited, and the (query, kind) pairs they answer."""

    @property
    def queries(self) -> Sequence[tuple[str, str]]: ...
    @property
    def session_id(self) -> str: ...
    @property
    def evidence(self) -> str: ...  # "read" | "edit"
    @property
    def path(self) -> str: ...
    @property
    def lines(self) -> Sequence[int]: ...
    @property
    def text(self) -> str | None: ...
    @property
    def window(self) -> str: ...
    @property
    def window_start(self) -> int: ...
    @property
    def window_end(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Pair:
    query: str
    chunk: Chunk
    repo: str  # what held-out evaluation splits on (a repository or source)
    session_id: str = ""
    query_kind: str = "user"  # "user" or the search tool's name ("semantic_search", "grep")
    evidence: str = "read"  # "read" | "edit"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["chunk"] = asdict(self.chunk)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Pair:
        return cls(**{**d, "chunk": Chunk(**d["chunk"])})


def default_chunker(path: str, text: str) -> list[Chunk]:
    """The index's chunker (tree-sitter where a grammar exists, else text windows)."""
    from embeddings.chunking import chunk_file

    return chunk_file(path, text.encode("utf-8", "surrogatepass"))


def overlapping(chunks: list[Chunk], lines: Iterable[int]) -> list[Chunk]:
    """Chunks overlapping the lines, the most specific only: a chunk that encloses another
    overlapping chunk (a class summary around the method that was read) is dropped."""
    ls = list(lines)
    hit = [c for c in chunks if any(c.start_line <= n <= c.end_line for n in ls)]
    return [c for c in hit if not any(
        o is not c and c.start_line <= o.start_line and o.end_line <= c.end_line
        and (o.start_line, o.end_line) != (c.start_line, c.end_line) for o in hit)]


class _ChunkCache:
    def __init__(self, chunker: Chunker):
        self.chunker = chunker
        self._by: dict[tuple[str, str], list[Chunk]] = {}

    def get(self, path: str, text: str) -> list[Chunk]:
        key = (path, text)
        if key not in self._by:
            if len(self._by) > 256:  # bound memory over a long log: texts are whole files
                self._by.clear()
            try:
                self._by[key] = self.chunker(path, text)
            except Exception:  # noqa: BLE001 - a file the chunker cannot handle gives no pairs
                self._by[key] = []
        return self._by[key]


def pairs_from_evidence(evidence: Iterable[Evidence], *, repo: str, chunker: Chunker | None = None,
                        max_chunks: int = 3) -> list[Pair]:
    """Pairs from evidence, in order; ``repo`` is what held-out evaluation splits on."""
    cache = _ChunkCache(chunker or default_chunker)
    seen: set[tuple[str, str, str]] = set()
    out: list[Pair] = []
    for ev in evidence:
        if ev.text is not None:
            chunks = overlapping(cache.get(ev.path, ev.text), ev.lines)
        else:
            chunks = [Chunk(ev.path, ev.window_start, ev.window_end, "window", "", "text", ev.window)]
        if not chunks or len(chunks) > max_chunks:
            continue
        for q, kind in ev.queries:
            for c in chunks:
                key = (ev.session_id, q, c.content_hash)
                if key in seen or not c.text.strip():
                    continue
                seen.add(key)
                out.append(Pair(q, c, repo, ev.session_id, kind, ev.evidence))
    return out


def write_pairs(pairs: Iterable[Pair], path: str | Path) -> int:
    """Write pairs as JSON lines; returns how many."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for p in pairs:
            f.write(json.dumps(p.to_json()) + "\n")
            n += 1
    return n


def read_pairs(path: str | Path) -> list[Pair]:
    with open(path, encoding="utf-8") as f:
        return [Pair.from_json(json.loads(line)) for line in f if line.strip()]
