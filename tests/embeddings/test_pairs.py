"""Pairs from evidence: chunk overlap, the specificity rules, the window fallback, dedupe, JSONL."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from embeddings.pairs import Pair, overlapping, pairs_from_evidence, read_pairs, write_pairs
from embeddings.types import Chunk

TEXT = "".join(f"line {n}\n" for n in range(1, 31))


@dataclass(frozen=True)
class Ev:  # any object with these attributes is evidence (embeddings/ imports no event types)
    lines: Sequence[int]
    text: str | None = TEXT
    queries: Sequence[tuple[str, str]] = (("find it", "user"),)
    session_id: str = "s"
    evidence: str = "read"
    path: str = "m.py"
    window: str = "shown text"
    window_start: int = 1
    window_end: int = 1


def chunker(path: str, text: str) -> list[Chunk]:
    """Ten-line chunks, plus one enclosing 'module' chunk."""
    lines = text.splitlines()
    out = [Chunk(path, s, s + 9, "block", f"b{s}", "text", "\n".join(lines[s - 1:s + 9])) for s in (1, 11, 21)]
    return out + [Chunk(path, 1, 30, "module", "", "text", text)]


def test_overlapping_keeps_the_most_specific() -> None:
    assert [c.symbol for c in overlapping(chunker("m.py", TEXT), [12, 13])] == ["b11"]


def test_too_many_chunks_give_nothing_and_unknown_text_uses_the_window() -> None:
    assert pairs_from_evidence([Ev(lines=range(1, 31))], repo="r", chunker=chunker, max_chunks=2) == []
    (p,) = pairs_from_evidence([Ev(lines=[5], text=None, window="def f(): pass", window_start=4, window_end=6)],
                               repo="r", chunker=chunker)
    assert (p.chunk.kind, p.chunk.start_line, p.chunk.end_line, p.chunk.text) == ("window", 4, 6, "def f(): pass")


def test_one_pair_per_session_query_and_chunk(tmp_path: Path) -> None:
    evs = [Ev(lines=[3]), Ev(lines=[4], evidence="edit"), Ev(lines=[3], session_id="t"),
           Ev(lines=[3], queries=(("find it", "user"), ("grep words", "grep")))]
    pairs = pairs_from_evidence(evs, repo="r", chunker=chunker)
    assert [(p.session_id, p.query, p.evidence) for p in pairs] == [
        ("s", "find it", "read"), ("t", "find it", "read"), ("s", "grep words", "read")]
    out = tmp_path / "pairs.jsonl"
    assert write_pairs(pairs, out) == 3 and read_pairs(out) == pairs and isinstance(pairs[0], Pair)


def test_a_chunker_that_fails_gives_no_pairs() -> None:
    def broken(path: str, text: str) -> list[Chunk]:
        raise ValueError("no grammar")

    assert pairs_from_evidence([Ev(lines=[3])], repo="r", chunker=broken) == []
