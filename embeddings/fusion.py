"""Hybrid ranking: how the vector and BM25 result lists are combined.

A convex combination of max-normalised scores (Bruch et al., "An Analysis of
Fusion Functions for Hybrid Retrieval", 2023, call the family TM2C2):
each list's scores are divided by that list's best score, so 1.0 is the best
hit of each retriever and 0 is "no similarity / no term matched"; then

    score(c) = (1 - w) * vector(c) + w * bm25(c),   w = bm25_weight_for(query)

A candidate missing from one list (it ranked below that list's pool) takes
the lowest normalised score in that list's pool, not 0: it may be just below
the cut.

Why not reciprocal rank fusion: RRF weighs both retrievers equally by rank,
and on docstring -> function search BM25 is much weaker than the embeddings
(MRR@10 0.28 vs 0.38 on the tuning packages), so equal-weight RRF came out
worse than vector search alone (0.354 vs 0.379); a convex combination keeps
the magnitude of each retriever's confidence.

The weight depends on the query (:func:`bm25_weight_for`): prose queries
("where are retries handled") lean on the embeddings (0.15); for queries that
are mostly code or tool output (a failing test's name and its error lines,
identifiers) the tuning picked BM25 alone (1.0): there the embeddings find
next to nothing (bug localisation on the tuning sdists, 114 queries: function
MRR@10 0.098 for BM25, 0.013 for vectors; every weight below 1 was worse once
symbol links were added). The vector list then only contributes candidates.
BM25 also indexes each chunk's path (``embeddings.index.bm25_text``), so a
module named in a query or in a failing test's file name counts.

Code queries also follow symbol links (:mod:`embeddings.symbols`): the
definitions that the chunks a query names by identifier refer to (a failing
test -> the functions it calls -> what those call, ``LINK_DEPTH`` hops) get
``LINK_WEIGHT`` added (halved per further hop), candidates or not. Neither
retriever gets from a failing test to the code under test; on the tuning
sdists they lift function MRR@10 from 0.098 (BM25 alone) to 0.118 and file
MRR@10 from 0.265 to 0.338 (``benchmarks/results/fusion_tune.json``).

The weights were chosen by ``benchmarks/fusion_tune.py`` on packages that are
not in the default evaluation: ``BM25_WEIGHT`` on docstring queries of httpx,
h11, pathspec, tqdm and anyio; ``CODE_QUERY_BM25_WEIGHT``, ``LINK_WEIGHT`` and
``LINK_DEPTH`` on bug-localisation queries of the pathspec 0.12.1, h11 0.14.0,
simplejson 4.3.0 and idna 3.20 sdists. Each is the grid point with the largest
worst-case margin over the better single retriever at function and file
level. ``benchmarks/search_quality.py`` then measures them on other packages
(click, packaging, jinja2 for docstrings; toolz, cachetools, boltons,
sqlparse, pyflakes, pycparser for bugs).

Not guaranteed: that the weights suit every corpus or query style (they were
tuned on Python code, with small bug-localisation samples); that
:func:`is_code_query` classifies mixed queries as a person would; scores are
comparable within one result list only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

BM25_WEIGHT = 0.15  # prose queries ("code that parses the config file")
CODE_QUERY_BM25_WEIGHT = 1.0  # queries that are mostly code: error output, test names, identifiers
LINK_WEIGHT = 0.3  # added to definitions linked from what a code query names (see embeddings.symbols)
LINK_DEPTH = 2  # hops of symbol links followed
POOL = 50  # candidates taken from each retriever (at least 5 * k)

_TOKEN = re.compile(r"\S+")
_CODEY = re.compile(
    r"[A-Za-z0-9]_[A-Za-z0-9]"  # snake_case
    r"|[a-z][A-Z]"  # camelCase
    r"|[A-Za-z_]\w*\.[A-Za-z_]"  # dotted.name, file.py
    r"|[()\[\]{}<>=:;'\"/\\]|^[+\-*%]"  # punctuation of code and error output
    r"|^\d+$"
)
_TRACE = re.compile(r"(Error|Exception|Traceback|assert\b|Warning)\b|\bline \d+", re.M)


def is_code_query(query: str) -> bool:
    """Most of the query is code or tool output (a traceback, a test name, identifiers), not prose:
    lexical matches are then worth more. Not guaranteed to agree with a human on mixed queries."""
    tokens = _TOKEN.findall(query)
    if not tokens:
        return False
    codey = sum(1 for t in tokens if _CODEY.search(t))
    return codey / len(tokens) >= 0.5 or (codey / len(tokens) >= 0.25 and bool(_TRACE.search(query)))


def bm25_weight_for(query: str) -> float:
    """The BM25 weight :func:`fuse` uses for this query."""
    return CODE_QUERY_BM25_WEIGHT if is_code_query(query) else BM25_WEIGHT


def normalise(results: Sequence[tuple[int, float]]) -> dict[int, float]:
    """Scores divided by the list's best score (a list whose best is <= 0 scores all zero)."""
    if not results:
        return {}
    best = max(s for _, s in results)
    if best <= 0:
        return {cid: 0.0 for cid, _ in results}
    return {cid: s / best for cid, s in results}


def fuse(vector: Sequence[tuple[int, float]], bm25: Sequence[tuple[int, float]],
         weight: float = BM25_WEIGHT, *, linked: Mapping[int, float] | None = None,
         link_weight: float = LINK_WEIGHT) -> list[tuple[int, float]]:  # fmt: skip
    """Candidates of both lists (and of ``linked``) ranked by the convex combination plus
    ``link_weight * linked[c]`` (ties by id), best first."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"BM25 weight must be in [0, 1], got {weight}")
    if link_weight < 0:
        raise ValueError(f"link weight must be >= 0, got {link_weight}")
    v, b = normalise(vector), normalise(bm25)
    v_floor = min(v.values(), default=0.0)
    b_floor = min(b.values(), default=0.0)
    linked = linked or {}
    fused = {cid: (1.0 - weight) * v.get(cid, v_floor) + weight * b.get(cid, b_floor)
             + link_weight * linked.get(cid, 0.0) for cid in v.keys() | b.keys() | linked.keys()}
    return sorted(fused.items(), key=lambda t: (-t[1], t[0]))
