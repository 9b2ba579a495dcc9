"""Merkle hashes over a workspace's indexed files.

A file's node hash is the sha256 of its bytes; a directory's is the sha256 of
its sorted ``name\\0kind\\0hash`` lines. Equal trees have equal root hashes
whatever workspace they live in, and a changed file changes exactly the hashes
of its ancestors. Only indexed files count (ignored/binary files are not part
of the tree).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict


def file_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def dir_hashes(files: dict[str, str]) -> dict[str, str]:
    """Map every directory ("" is the root) to its hash, given path → file hash."""
    children: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
    dirs: set[str] = {""}
    for path, h in files.items():
        parent, _, name = path.rpartition("/")
        children[parent].append((name, "f", h))
        while parent and parent not in dirs:
            dirs.add(parent)
            parent = parent.rpartition("/")[0]
    out: dict[str, str] = {}
    for d in sorted(dirs, key=lambda p: -p.count("/") if p else 1):  # deepest first, root last
        if d:
            parent, _, name = d.rpartition("/")
        lines = sorted(children[d])
        digest = hashlib.sha256("".join(f"{n}\0{k}\0{h}\n" for n, k, h in lines).encode("utf-8", "surrogateescape"))
        out[d] = digest.hexdigest()
        if d:
            children[parent].append((name, "d", out[d]))
    return out
