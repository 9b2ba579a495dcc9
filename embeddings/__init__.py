"""Semantic code search: tree-sitter chunks, an incremental embedding + BM25
index, hybrid ranking (see issue 5 and ../shared/ARCHITECTURE.md)."""
