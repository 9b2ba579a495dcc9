"""Symbol links between chunks: which definitions a chunk names, by identifier.

A failing test's output names the test, not the code under test; neither BM25
nor the embeddings get from one to the other (bug localisation over six sdists:
about 85% of BM25's top 10 were test chunks, and the mutated function was
outside its top 50 in most queries). This module supplies the missing hop: the
chunks a query names by identifier (``test_reduceby``), then the definitions
their text names (``reduceby``, the helpers it calls), like a developer
opening the test and following the calls.

Resolution is by name only: ``reduceby`` links to every function, method or
class whose last name part is ``reduceby``. Names defined in more than
``max_defs`` places (``__init__``, ``get``) are ambiguous and ignored.

Not guaranteed: a call graph (no imports, scopes, receivers or dynamic dispatch
are resolved; a name in a comment or string counts as a reference); that the
definitions found are the ones executed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from embeddings.types import Chunk

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
DEFINITION_KINDS = frozenset({"function", "method", "class"})


def identifiers(text: str) -> set[str]:
    """Identifier-like words of at least 3 characters."""
    return set(_IDENT.findall(text))


class SymbolTable:
    """Definition chunks by their name's last part (``Class.method`` -> ``method``); updated as
    chunks come and go."""

    def __init__(self, *, max_defs: int = 5) -> None:
        if max_defs < 1:
            raise ValueError(f"max_defs must be >= 1, got {max_defs}")
        self.max_defs = max_defs
        self._defs: dict[str, set[int]] = {}

    @staticmethod
    def name_of(chunk: Chunk) -> str | None:
        if chunk.kind not in DEFINITION_KINDS or not chunk.symbol:
            return None
        return chunk.symbol.rsplit(".", 1)[-1]

    def add(self, cid: int, chunk: Chunk) -> None:
        name = self.name_of(chunk)
        if name:
            self._defs.setdefault(name, set()).add(cid)

    def remove(self, cid: int, chunk: Chunk) -> None:
        name = self.name_of(chunk)
        ids = self._defs.get(name) if name else None
        if ids is not None:
            ids.discard(cid)
            if not ids:
                del self._defs[name]

    def resolve(self, names: Iterable[str]) -> set[int]:
        """Definitions of these names, skipping names defined in more than ``max_defs`` places."""
        out: set[int] = set()
        for n in names:
            ids = self._defs.get(n)
            if ids and len(ids) <= self.max_defs:
                out |= ids
        return out

    def neighbours(self, query: str, text_of: Callable[[int], str], *, depth: int = 1,
                   decay: float = 0.5, max_read: int = 200) -> dict[int, float]:
        """Chunks reached from the definitions ``query`` names: 1.0 for what those name directly,
        ``decay`` for the next hop, and so on up to ``depth`` hops. The named chunks themselves
        are not included (the query already matches them lexically). At most ``max_read`` chunk
        texts are scanned for names (a long traceback naming many symbols in a large tree stays
        cheap); a hop whose frontier is larger is not expanded further."""
        named = self.resolve(identifiers(query))
        seen = set(named)
        frontier = named
        out: dict[int, float] = {}
        read = 0
        for hop in range(depth):
            read += len(frontier)
            if read > max_read:
                break
            nxt = self.resolve({w for cid in frontier for w in identifiers(text_of(cid))}) - seen
            for cid in nxt:
                out[cid] = decay**hop
            seen |= nxt
            frontier = nxt
            if not frontier:
                break
        return out
