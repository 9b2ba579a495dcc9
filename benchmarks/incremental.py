"""Edit → search freshness through the runtime's own edit path, and proof that
an edit re-embeds only the chunks it changed.

A real tree (copies of installed packages, default httpx) is put in a
Workspace and indexed (vectors come from the shared cache in ``--data-dir``
when search_latency ran first), then padded with SYNTHETIC chunks (noisy
copies of the real ones, under ``copyJ/`` paths that are not files) up to
``--pad`` (default 10k) so that search and BM25-rebuild costs are those of a
10k-chunk index. Then,
``--edits`` times: pick a random Python function chunk, insert a line with a
unique marker identifier at its end (candidates whose edit would not parse are
skipped and counted: a syntax error can re-chunk the rest of a file, e.g. 165 of
242 chunks once, which is a different cost) with the ``edit_file`` tool, hand the result
to ``ToolContext.after_call`` (exactly what the executor does after every
call), and search (hybrid, k=10) for the marker: latency is from the tool returning
to that search returning (the search first applies the edit: re-chunk, embed
new chunks, update vectors and BM25). Then, untimed, it checks that BM25's
top-1 for the marker and the vector search's top-1 for the new chunk's text
are the edited chunk (``found``); whether the marker chunk also made the
hybrid top-10 is reported separately (fusion can push a BM25-only hit below
chunks that both rankers like, e.g. earlier markers). Each edit
records how many chunks the file has, how many chunk hashes are new, and how
many texts the embedder was actually given (the query is counted separately).

Usage: python benchmarks/incremental.py [--packages a,b] [--edits 30]
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import os
import random
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
from _common import percentile, write_result
from search_latency import build_tree, synthetic

from embeddings.embedder import SentenceTransformerEmbedder
from embeddings.index import WorkspaceIndex
from tools.base import ToolContext
from tools.edit_file import EditFile
from tools.workspace import WorkspaceStore

os.environ.setdefault("HF_HUB_OFFLINE", "1")


class CountingEmbedder:
    def __init__(self, inner: SentenceTransformerEmbedder) -> None:
        self.inner, self.calls = inner, []  # type: ignore[var-annotated]

    name = property(lambda self: self.inner.name)
    dim = property(lambda self: self.inner.dim)

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return self.inner.embed(texts)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)


async def run(args: argparse.Namespace) -> dict:
    embedder = CountingEmbedder(SentenceTransformerEmbedder())
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        versions = build_tree(args.packages.split(","), src)
        ws = WorkspaceStore(Path(tmp) / "store").from_dir(src)
        index = WorkspaceIndex(ws.root, embedder=embedder, data_dir=args.data_dir)
        t = time.perf_counter()
        built = index.refresh()
        build_s = time.perf_counter() - t
        candidates = [c for c in index.chunks() if c.kind in ("function", "method") and c.language == "python"
                      and c.text.count("\n") >= 2]
        real_chunks = len(index)
        if args.pad > real_chunks:  # synthetic padding so BM25/vector costs are those of a bigger index
            chunks, vecs = synthetic(index, args.pad - real_chunks, noise=0.03)
            index.load_chunks(chunks, vecs)
        index.search("warm up")  # builds BM25 once, as a long-running session would have
        ctx = ToolContext(ws, search_index=index)
        tool = EditFile()
        rows, lat, total = [], [], []
        skipped_invalid = 0
        for i in range(20 * args.edits):
            if len(rows) == args.edits:
                break
            chunk = rng.choice(candidates)
            lines = chunk.text.split("\n")
            data = ws.read_bytes(chunk.path).decode()
            if data.count(chunk.text) != 1:  # the chunk must be verbatim and unique in the file
                continue
            indent = lines[1][: len(lines[1]) - len(lines[1].lstrip())] or "    "
            marker = f"flywheel_marker_{i}_{uuid.uuid4().hex[:12]}"  # new text: never in the shared cache
            try:  # an edit that breaks the syntax re-chunks the rest of the file: not what this measures
                ast.parse(data.replace(chunk.text, f"{chunk.text}\n{indent}{marker} = None"))
            except SyntaxError:
                skipped_invalid += 1
                continue
            before = {c.content_hash for c in index.chunks(chunk.path)}
            n_before = len(embedder.calls)
            t0 = time.perf_counter()
            a = {"path": chunk.path, "search": chunk.text, "replace": f"{chunk.text}\n{indent}{marker} = None"}
            result = await tool.run(a, ctx)
            assert result.ok, result.output
            ctx.after_call(tool.resources(a), result)
            t1 = time.perf_counter()
            hits = await asyncio.to_thread(index.search, marker, 10)
            t2 = time.perf_counter()
            n_after = len(embedder.calls)  # the checks below embed their own queries
            found_hybrid = any(h.chunk.path == chunk.path and marker in h.chunk.text for h in hits)
            # untimed checks that each half of the index has the new chunk: BM25 top-1 for the
            # marker, and vector top-1 for the new chunk's own text
            lex = index.search(marker, 1, mode="bm25")
            new_chunk = next((c for c in index.chunks(chunk.path) if marker in c.text), None)
            vec = index.search(new_chunk.text, 1, mode="vector") if new_chunk else []
            found = bool(lex and marker in lex[0].chunk.text and vec and marker in vec[0].chunk.text)
            after = {c.content_hash for c in index.chunks(chunk.path)}
            texts = [t for call in embedder.calls[n_before:n_after] for t in call if t != marker]
            rows.append({"path": chunk.path, "symbol": chunk.symbol, "file_chunks": len(after),
                         "new_chunk_hashes": len(after - before), "embedded": len(texts), "found": found,
                         "found_in_hybrid_top10": found_hybrid})
            lat.append(t2 - t1)
            total.append(t2 - t0)
        index.close()
        ws.delete()
    ms = lambda v, q: round(percentile(v, q) * 1000, 1)  # noqa: E731
    return {
        "packages": versions, "model": embedder.name, "chunks": len(index), "real_chunks": real_chunks,
        "synthetic_padding_chunks": len(index) - real_chunks,
        "index_build": {"seconds": round(build_s, 1), "embedded": built.embedded, "reused": built.reused},
        "edits": len(rows),
        "candidate_edits_skipped_as_invalid_python": skipped_invalid,
        "edit_to_search_visible": {"p50_ms": ms(lat, 50), "p95_ms": ms(lat, 95), "max_ms": round(max(lat) * 1000, 1)},
        "edit_tool_plus_search": {"p50_ms": ms(total, 50), "p95_ms": ms(total, 95)},
        "all_found_bm25_and_vector": all(r["found"] for r in rows),
        "found_in_hybrid_top10": sum(r["found_in_hybrid_top10"] for r in rows),
        "reembedding": {
            "file_chunks_total": sum(r["file_chunks"] for r in rows),
            "new_chunk_hashes_total": sum(r["new_chunk_hashes"] for r in rows),
            "embedded_total": sum(r["embedded"] for r in rows),
            # at most the new hashes: a new hash whose text is already in the shared cache is reused
            "every_edit_embedded_at_most_its_new_hashes": all(r["embedded"] <= r["new_chunk_hashes"] for r in rows),
        },
        "per_edit": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--packages", default="httpx")
    ap.add_argument("--edits", type=int, default=30)
    ap.add_argument("--pad", type=int, default=10_000,
                    help="pad the index with synthetic chunks (copies of the real ones) up to this many")
    ap.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "flywheel-bench-index")
    write_result("incremental", asyncio.run(run(ap.parse_args())))


if __name__ == "__main__":
    main()
