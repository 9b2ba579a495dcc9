"""``semantic_search``: find code by meaning (hybrid embedding + BM25 search)."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Mapping
from typing import Any

from tools.base import WHOLE_TREE, ParamSpec, ParamType, Resources, ToolContext, ToolError, ToolResult, ToolSpec

MAX_K = 50
SNIPPET_LINES = 3
SNIPPET_CHARS = 120


class SemanticSearch:
    """Needs ``ctx.search_index`` (a :class:`embeddings.index.WorkspaceIndex` over
    ``ctx.workspace.root``, or a server's :class:`embeddings.background.BackgroundIndex`,
    which answers "still being built" as an error result). Not guaranteed: results are ranked by similarity, so a
    query always returns the nearest chunks even when none is relevant."""

    spec = ToolSpec(
        name="semantic_search",
        description=(
            "Search the codebase by meaning: functions, methods, classes and text passages that "
            "match a natural-language description, ranked by a fusion of embedding similarity and "
            "keyword (BM25) relevance. Prefer it over grep when you know what the code does but "
            "not what it is called ('where are retries with backoff handled', 'code that parses "
            "the config file'); use grep for exact identifiers, strings and regular expressions. "
            "Given a failing test's name and error output, it also returns the functions that test "
            "calls, not just the test. "
            "Each result is 'path:start-end  symbol  score' followed by a short snippet; read the "
            "file for the full code. Reflects edits made earlier in the session."
        ),
        params=(
            ParamSpec("query", ParamType.STRING, "What you are looking for, in words (or code)."),
            ParamSpec("path_glob", ParamType.STRING,
                      "Only search files matching this glob (e.g. 'src/**/*.py', '*.ts', 'tests/').",
                      False, None),
            ParamSpec("k", ParamType.INTEGER, f"How many results (1-{MAX_K}).", False, 10),
        ),
    )

    def resources(self, args: Mapping[str, Any]) -> Resources:
        return Resources(reads=frozenset({WHOLE_TREE}))

    async def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        query: str = args["query"]
        glob: str | None = args.get("path_glob") or None
        k = args.get("k")
        k = 10 if k is None else k
        if not query.strip():
            raise ToolError("query must not be empty")
        if not 1 <= k <= MAX_K:
            raise ToolError(f"k must be between 1 and {MAX_K} (got {k})")
        index = ctx.search_index
        if index is None:
            raise ToolError("semantic search is not available in this workspace (no index); use grep")
        from embeddings.background import IndexNotReady

        try:
            hits = await asyncio.to_thread(index.search, query, k, glob)
        except IndexNotReady as exc:
            raise ToolError(str(exc)) from None
        if not hits:
            where = f" in files matching {glob!r}" if glob else ""
            return ToolResult(True, f"no results{where}", data={"results": 0})
        blocks = []
        for h in hits:
            c = h.chunk
            head = f"{c.location}  {c.symbol or '-'}  {h.score:.4f}"
            blocks.append(head + "\n" + snippet(c.text))
        return ToolResult(True, "\n".join(blocks), data={
            "results": len(hits),
            "hits": [{"path": h.chunk.path, "start_line": h.chunk.start_line, "end_line": h.chunk.end_line,
                      "symbol": h.chunk.symbol, "score": round(h.score, 6)} for h in hits],
        })


def snippet(text: str) -> str:
    lines = textwrap.dedent("\n".join(ln.rstrip() for ln in text.splitlines() if ln.strip())).splitlines()[:SNIPPET_LINES]
    return "\n".join("    " + (ln if len(ln) <= SNIPPET_CHARS else ln[:SNIPPET_CHARS] + "…") for ln in lines)
