"""embeddings/symbols.py: definitions by name, and the links a query's named chunks make."""

from __future__ import annotations

import pytest

from embeddings.symbols import SymbolTable, identifiers
from embeddings.types import Chunk


def chunk(symbol: str, text: str, kind: str = "function", path: str = "pkg/mod.py") -> Chunk:
    return Chunk(path, 1, 2, kind, symbol, "python", text)


CHUNKS = {
    1: chunk("test_reduceby", "def test_reduceby():\n    assert reduceby(iseven, add, data) == {}", path="tests/t.py"),
    2: chunk("reduceby", "def reduceby(key, binop, seq):\n    return _group(key, seq)"),
    3: chunk("_group", "def _group(key, seq):\n    return {}"),
    4: chunk("iseven", "def iseven(x):\n    return x % 2 == 0", path="tests/t.py"),
    5: chunk("", "reduceby = 1  # a window, not a definition", kind="window"),
}


@pytest.fixture
def table() -> SymbolTable:
    t = SymbolTable()
    for cid, c in CHUNKS.items():
        t.add(cid, c)
    return t


def text_of(cid: int) -> str:
    return CHUNKS[cid].text


def test_identifiers_are_words_of_three_or_more_characters() -> None:
    assert identifiers("f(x) + reduceby_2 == ok") == {"reduceby_2"}


def test_a_named_test_links_to_the_functions_it_calls(table: SymbolTable) -> None:
    out = table.neighbours("tests/t.py test_reduceby\nKeyError: False", text_of)
    assert out == {2: 1.0, 4: 1.0}  # reduceby and iseven; not the test itself, not the window


def test_a_second_hop_is_discounted(table: SymbolTable) -> None:
    out = table.neighbours("test_reduceby failed", text_of, depth=2, decay=0.5)
    assert out == {2: 1.0, 4: 1.0, 3: 0.5}


def test_nothing_named_links_nowhere(table: SymbolTable) -> None:
    assert table.neighbours("AssertionError: assert 1 == 2", text_of, depth=3) == {}


def test_names_defined_in_too_many_places_are_ignored() -> None:
    t = SymbolTable(max_defs=2)
    for cid in range(3):
        t.add(cid, chunk(f"C{cid}.get", "def get(self): pass"))
    t.add(9, chunk("test_get", "def test_get():\n    get()"))
    assert t.resolve(["get"]) == set()
    assert t.neighbours("test_get", lambda cid: "def test_get():\n    get()") == {}
    with pytest.raises(ValueError, match="max_defs"):
        SymbolTable(max_defs=0)


def test_removed_definitions_stop_linking(table: SymbolTable) -> None:
    table.remove(2, CHUNKS[2])
    assert table.resolve(["reduceby"]) == set()
    assert table.neighbours("test_reduceby", text_of) == {4: 1.0}
    table.remove(5, CHUNKS[5])  # not a definition: a no-op


def test_reading_is_bounded(table: SymbolTable) -> None:
    reads: list[int] = []

    def counting(cid: int) -> str:
        reads.append(cid)
        return text_of(cid)

    assert table.neighbours("test_reduceby", counting, depth=2, max_read=2) == {2: 1.0, 4: 1.0}
    assert reads == [1]  # the second hop would read two more texts: 1 + 2 > 2
    assert table.neighbours("test_reduceby", text_of, depth=2, max_read=0) == {}
