"""Round trip for any string; special and tool tokens are single ids; save/load."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.model.tokenizer import SPECIAL_TOKENS, TOOL_TOKENS, Tokenizer
from agent.prompt import CHAT_TEMPLATE

PIECES = st.sampled_from([*SPECIAL_TOKENS, *TOOL_TOKENS, "\n", " ", "<", "|", "</", "\r\n", "é", "🙂", "\x00"])


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_round_trip_any_text(tokenizer: Tokenizer, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text)) == text


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(PIECES, st.text(max_size=8)), max_size=20).map("".join))
def test_round_trip_around_markers(tokenizer: Tokenizer, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_special_and_tool_tokens_are_single_ids(tokenizer: Tokenizer) -> None:
    ids = [tokenizer.token_id(t) for t in (*SPECIAL_TOKENS, *TOOL_TOKENS)]
    assert len(set(ids)) == len(ids)
    assert tokenizer.pad_id == 0 and tokenizer.eos_id == 1
    for token, i in zip((*SPECIAL_TOKENS, *TOOL_TOKENS), ids, strict=True):
        assert tokenizer.encode(token) == [i]
        assert i in tokenizer.encode(f"x{token}y")
    # the template's markers: special token + an ordinary newline
    for role in ("system", "user", "assistant", "tool", "end"):
        marker = getattr(CHAT_TEMPLATE, role)
        assert tokenizer.encode(marker) == [tokenizer.token_id(marker.rstrip("\n")), *tokenizer.encode("\n")]
    assert tokenizer.end_id == tokenizer.token_id("<|end|>")


def test_tool_tokens_survive_skip_special(tokenizer: Tokenizer) -> None:
    text = '<|assistant|>\n<tool_call name="read_file">\n<param name="path">a.py</param>\n</tool_call>\n<|end|>\n'
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids, skip_special_tokens=True) == text.replace("<|assistant|>", "").replace("<|end|>", "")
    for piece in ("<tool_call", "</tool_call>", "<param", "</param>"):
        assert tokenizer.token_id(piece) in ids


def test_save_load(tokenizer: Tokenizer, tmp_path: Path) -> None:
    tokenizer.save(tmp_path)
    again = Tokenizer.load(tmp_path)
    assert again.vocab_size == tokenizer.vocab_size
    text = "def f(x):\n    return x <|end|> </param>\n"
    assert again.encode(text) == tokenizer.encode(text)


def test_vocab_size_bounded(tokenizer: Tokenizer) -> None:
    assert 300 < tokenizer.vocab_size <= 512
