"""The on-disk embedding cache shared by every workspace index in a data dir.

``DATA_DIR/embeddings.sqlite``, table ``vectors(model, hash, vec)``: the
float32 bytes of the embedding of a chunk's text under a model, keyed by the
chunk's ``content_hash``. Two workspaces (or two refreshes) that hold the same
chunk text never embed it twice. SQLite in WAL mode; safe across processes.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path

import numpy as np


class EmbeddingCache:
    def __init__(self, path: Path, model: str, dim: int | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.model = model
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS vectors (model TEXT NOT NULL, hash TEXT NOT NULL, vec BLOB NOT NULL,"
            " PRIMARY KEY (model, hash)) WITHOUT ROWID"
        )
        self._db.commit()

    def get_many(self, hashes: Iterable[str]) -> dict[str, np.ndarray]:
        wanted = list(dict.fromkeys(hashes))
        out: dict[str, np.ndarray] = {}
        with self._lock:
            for i in range(0, len(wanted), 500):
                part = wanted[i:i + 500]
                q = f"SELECT hash, vec FROM vectors WHERE model = ? AND hash IN ({','.join('?' * len(part))})"
                for h, blob in self._db.execute(q, [self.model, *part]):
                    out[h] = np.frombuffer(blob, dtype=np.float32)
        return out

    def put_many(self, items: dict[str, np.ndarray]) -> None:
        if not items:
            return
        with self._lock:
            self._db.executemany(
                "INSERT OR IGNORE INTO vectors (model, hash, vec) VALUES (?, ?, ?)",
                [(self.model, h, np.asarray(v, dtype=np.float32).tobytes()) for h, v in items.items()],
            )
            self._db.commit()

    def close(self) -> None:
        with self._lock:
            self._db.close()
