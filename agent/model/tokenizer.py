"""Byte-level BPE tokenizer (HuggingFace ``tokenizers``) with Flywheel's special tokens.

Special tokens (ids 0..6, in this order): ``<|pad|>``, ``<|eos|>`` and the
chat-template role markers ``<|system|>``, ``<|user|>``, ``<|assistant|>``,
``<|tool|>``, ``<|end|>``. ``agent.prompt.CHAT_TEMPLATE`` writes each marker
followed by a newline (``"<|user|>\\n"``); the special token is the marker
**without** the newline, and the newline is an ordinary token. That way the
marker tokenises the same wherever it appears (also at the very end of a
rendered prompt, or when a model writes ``<|end|>`` without a newline), the
engine's stop token is the single id of ``<|end|>``, and ``decode(encode(s))``
stays exact. ``<|eos|>`` separates documents in pretraining; ``<|pad|>``
(id 0) is never trained on. Generation never shows any of them as text: the
engine ends a sequence at every special token (``agent.model.engine``).

The tool-call format's tag openings and closings (``<tool_call``,
``</tool_call>``, ``<param``, ``</param>``, ``<tool_result``,
``</tool_result>``) are *added* tokens, not special ones: each is one id, but
they are ordinary text that ``decode(..., skip_special_tokens=True)`` keeps.
They match anywhere in the text, so ``<parameter`` is ``<param`` + ``eter``.

Pre-tokenisation splits with the GPT-4 pattern (digits in groups of at most
two, as in nanochat, since the vocabulary is small) and then maps bytes to
characters (byte-level), so every string — any Unicode, any control
character — round-trips: ``decode(encode(s)) == s``. Not guaranteed: that
decoding an arbitrary *slice* of ids gives valid UTF-8 (a slice may cut a
multi-byte character; such bytes decode to U+FFFD).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from agent.prompt import CHAT_TEMPLATE

ROLE_TOKENS = CHAT_TEMPLATE.special_tokens  # the role markers, then the end marker
PAD, EOS = "<|pad|>", "<|eos|>"
SPECIAL_TOKENS = (PAD, EOS, *ROLE_TOKENS)
TOOL_TOKENS = ("<tool_call", "</tool_call>", "<param", "</param>", "<tool_result", "</tool_result>")
SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
)
FILENAME = "tokenizer.json"


class Tokenizer:
    """A trained ``tokenizers.Tokenizer`` plus Flywheel's token conventions."""

    def __init__(self, tok: HFTokenizer) -> None:
        self._tok = tok
        missing = [t for t in (*SPECIAL_TOKENS, *TOOL_TOKENS) if tok.token_to_id(t) is None]
        if missing:
            raise ValueError(f"tokenizer lacks Flywheel's tokens: {', '.join(missing)}")

    # -- the API -----------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int:
        """The id of a special or added token (``KeyError`` if it is not one token)."""
        i = self._tok.token_to_id(token)
        if i is None:
            raise KeyError(token)
        return i

    @property
    def pad_id(self) -> int:
        return self.token_id(PAD)

    @property
    def eos_id(self) -> int:
        return self.token_id(EOS)

    @property
    def end_id(self) -> int:
        """``<|end|>``: closes a message; the generation engine's stop token."""
        return self.token_id(CHAT_TEMPLATE.end.rstrip("\n"))

    @property
    def special_ids(self) -> dict[str, int]:
        return {t: self.token_id(t) for t in SPECIAL_TOKENS}

    # -- persistence --------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        path = d / FILENAME
        tmp = path.with_suffix(".json.tmp")
        self._tok.save(str(tmp))
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, directory: str | Path) -> Tokenizer:
        path = Path(directory) / FILENAME
        if not path.is_file():
            raise FileNotFoundError(f"no {FILENAME} in {directory}")
        return cls(HFTokenizer.from_file(str(path)))

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size})"


def _empty() -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(texts: Iterable[str], vocab_size: int, *, min_frequency: int = 2) -> Tokenizer:
    """Train byte-level BPE on ``texts``; the result has at most ``vocab_size`` ids
    (the trainer may stop a merge or more short, and small corpora yield fewer)."""
    floor = 256 + len(SPECIAL_TOKENS) + len(TOOL_TOKENS)
    if vocab_size < floor:
        raise ValueError(f"vocab_size must be at least {floor} (256 bytes + special and tool tokens)")
    tok = _empty()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TOOL_TOKENS),
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False, single_word=False) for t in TOOL_TOKENS])
    return Tokenizer(tok)
