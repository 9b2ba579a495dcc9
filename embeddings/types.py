"""Types shared by chunking, the index and the search tool."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of a file worth embedding: a function, method or class (with its
    signature and docstring), or a window of lines.

    ``start_line``/``end_line`` are 1-based and inclusive. ``content_hash`` is
    the sha256 of ``text`` (what gets embedded), so equal text is embedded once
    wherever it appears.
    """

    path: str  # workspace-relative, '/'-separated
    start_line: int
    end_line: int
    kind: str  # "function" | "method" | "class" | "window" | ...
    symbol: str  # qualified name ("Class.method"), "" for windows
    language: str  # "python", "javascript", ..., "text"
    text: str

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8", "surrogatepass")).hexdigest()

    @property
    def location(self) -> str:
        return f"{self.path}:{self.start_line}-{self.end_line}"


@dataclass(frozen=True, slots=True)
class SearchHit:
    chunk: Chunk
    score: float
    source: str  # "hybrid" | "vector" | "bm25"
