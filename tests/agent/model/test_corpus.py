"""The corpus: deterministic, split by file, capped; transcripts parse and validate with the real parser."""

from __future__ import annotations

from agent.calls import ToolCall, validate_call
import pytest

from agent.model.corpus import build_corpus, code_roots
from agent.parser import MalformedCall, ParsedCall, StreamParser
from agent.prompt import CHAT_TEMPLATE
from tools.registry import default_tools


def test_deterministic_capped_and_split_by_file() -> None:
    a = build_corpus(max_bytes=2 << 20, n_transcripts=10)
    b = build_corpus(max_bytes=2 << 20, n_transcripts=10)
    assert [d.key for d in a.train] == [d.key for d in b.train] and a.fingerprint == b.fingerprint
    s = a.summary()
    assert s["train_bytes"] + s["val_bytes"] <= 2 << 20 and s["val_docs"] > 0
    assert not {d.key for d in a.train} & {d.key for d in a.val}
    keys = [d.key for d in a.train + a.val]
    assert any(k.startswith("stdlib/") for k in keys) and any(k.startswith("site-packages/") for k in keys)
    assert not any("/site-packages/" in k for k in keys if k.startswith("stdlib/"))
    # the split is a function of the key: a bigger cap never moves a file between splits
    big = build_corpus(max_bytes=4 << 20, n_transcripts=10)
    split_of = {d.key: "val" for d in big.val} | {d.key: "train" for d in big.train}
    for split, docs in (("train", a.train), ("val", a.val)):
        assert all(split_of.get(d.key, split) == split for d in docs)


def test_shuffle_is_seeded() -> None:
    c = build_corpus(max_bytes=1 << 20, n_transcripts=4)
    first = list(c.texts("train", shuffle_seed=3))[:5]
    assert first == list(c.texts("train", shuffle_seed=3))[:5]
    assert first != list(c.texts("train", shuffle_seed=4))[:5]


def test_transcripts_use_the_real_format() -> None:
    c = build_corpus(max_bytes=1 << 20, n_transcripts=40)
    specs = {t.spec.name: t.spec for t in default_tools()}
    docs = [d for d in c.train + c.val if d.key.startswith("transcripts/")]
    assert docs
    n_calls = 0
    for doc in docs:
        text = c.read(doc)
        assert text is not None and text.startswith(CHAT_TEMPLATE.system) and text.endswith(CHAT_TEMPLATE.end)
        assert c.read(doc) == text  # deterministic
        for turn in text.split(CHAT_TEMPLATE.assistant)[1:]:
            body = turn.split("\n" + CHAT_TEMPLATE.end, 1)[0]
            parser = StreamParser()
            events = parser.feed(body) + parser.finish()
            assert not [e for e in events if isinstance(e, MalformedCall)]
            for e in events:
                if isinstance(e, ParsedCall):
                    assert isinstance(validate_call(e, specs, "c"), ToolCall)
                    n_calls += 1
        assert "<tool_result" in text
    assert n_calls >= len(docs)


def test_a_stdlib_only_corpus_leaves_the_installed_packages_out() -> None:
    """``code_roots(("stdlib",))``: the corpus then depends on the Python version, not on which package
    versions this environment installed; unknown or no sources are refused."""
    assert [name for name, _ in code_roots(("stdlib",))] == ["stdlib"]
    c = build_corpus(max_bytes=2 << 20, n_transcripts=4, roots=code_roots(("stdlib",)))
    keys = [d.key for d in c.train + c.val]
    assert any(k.startswith("stdlib/") for k in keys) and not any(k.startswith("site-packages/") for k in keys)
    assert c.fingerprint != build_corpus(max_bytes=2 << 20, n_transcripts=4).fingerprint
    for bad in (("stdlib", "pypi"), ()):
        with pytest.raises(ValueError, match="choose from stdlib, site-packages"):
            code_roots(bad)
