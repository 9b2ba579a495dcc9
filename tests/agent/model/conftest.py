"""Shared, session-scoped: a small real corpus and a tokenizer trained on it."""

from __future__ import annotations

import pytest

from agent.model.corpus import Corpus, build_corpus
from agent.model.tokenizer import Tokenizer, train_tokenizer


@pytest.fixture(scope="session")
def small_corpus() -> Corpus:
    # transcripts rendered with the profile the tiny preset's checkpoints are served with
    return build_corpus(max_bytes=1 << 20, n_transcripts=24, val_fraction=0.05, prompt_profile="compact")


@pytest.fixture(scope="session")
def tokenizer(small_corpus: Corpus) -> Tokenizer:
    return train_tokenizer(small_corpus.texts("train"), 512)
