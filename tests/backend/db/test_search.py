"""backend/db/search.py without a database: the query language and snippets."""

from __future__ import annotations

import pytest

from backend.db.search import MAX_TERMS, QueryError, Term, fts5_query, parse_query, snippet, tsquery


def test_queries_become_terms_of_words() -> None:
    assert parse_query('Fix "off by one" stats.py read_fil*') == [
        Term(("fix",)), Term(("off", "by", "one")), Term(("stats", "py")), Term(("read", "fil"), prefix=True)]
    assert parse_query("ÉCOLE") == [Term(("école",))]
    assert len(parse_query(" ".join(f"w{i}" for i in range(50)))) == MAX_TERMS
    for empty in ("", "   ", "*** --- !!!", '""', "ab*", "x*"):
        with pytest.raises(QueryError):
            parse_query(empty)
    assert parse_query("abc*") == [Term(("abc",), prefix=True)]


def test_both_dialects_get_the_same_meaning() -> None:
    terms = parse_query('fix "off by" pre*')
    assert fts5_query(terms) == '"fix" "off by" "pre" *'
    assert tsquery(terms) == "(fix) & (off <-> by) & (pre:*)"
    hostile = parse_query("a\" OR 1=1 -- ) & | ! <-> :*")
    assert all(w.isalnum() for t in hostile for w in t.words)  # nothing but words reaches either engine


def test_a_snippet_is_a_window_around_the_first_hit() -> None:
    text = " ".join(f"w{i}" for i in range(100)) + " target " + " ".join(f"v{i}" for i in range(100))
    segs = snippet(text, parse_query("target"))
    joined = "".join(s.text for s in segs)
    assert segs[0].text == "…" and segs[-1].text == "…" and "target" in joined and len(joined) < 200
    assert [s.text for s in segs if s.match] == ["target"]
    assert [s.text for s in snippet("Suffixes: prefab and prefix.", parse_query("pref*")) if s.match] == \
        ["prefab", "prefix"]
    assert snippet("no hit here", parse_query("zzz"))[0].text.startswith("no hit")
    assert snippet("", parse_query("x")) == [] and snippet("!!!", parse_query("x"))[0].text == "!!!"
