"""Which of a demonstration's sampled tokens are COPIES from its context: the names and code
the model must reproduce from the request or a tool result (a path, a ``search`` line).

Why it is measured apart: in a demonstration most sampled tokens are format (``<tool_call
name="read_file">``, ``<param name="path">``), predictable from the format alone, and a model
that has learned the format but cannot copy still reaches a low mean loss. Measured on the
sixth run's SFT checkpoint (docs/rl/runs.md): mean held-out loss 0.69, yet ~4-8 nats on each
token of the path it had to copy from the request, so every free-running rollout invented a
path. The copy-token loss and accuracy show that directly, and ``sft.copy_weight`` puts more of
the gradient on them.

The rule, on token ids only: a sampled token is a copy when the trigram it ends (with the two
tokens before it) occurs in the example's context before its segment (consumed tokens: the
request, tool results; the model's own earlier outputs count too, they are in its context) but
not in the system prompt, and the token is not tool-call syntax, a newline or ``<|end|>``
(:func:`format_token_ids`: the format is learned without copying).
An EXIT (:func:`exit_flags`) is the sampled token right after a copied span that is not a copy
itself: where the model must stop copying — the ``/`` after the old name in ``sed -i 's/OLD/NEW/g'``,
the ``</param>`` after a grep pattern. Copying past it is how rename and find-and-change rollouts
derail (``benchmarks/copy_exit_probe.py``): the span's source continues (the request's closing
backtick after the name) and the model follows it. ``sft.exit_weight`` weighs exits in the loss.
Not guaranteed: that every copied token is found (the first two tokens of a copied span end
trigrams that straddle the span's start, and are found only when that trigram also occurs in
the context) or that every token found was copied (a trigram that happens to repeat).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rl.types import Segment

__all__ = ["copy_flags", "exit_flags", "format_token_ids", "user_marker_id"]


def user_marker_id(tokenizer: Any) -> int:
    """The id of the chat template's ``<|user|>`` marker (one special token)."""
    ids = tokenizer.encode("<|user|>")
    if len(ids) != 1:
        raise ValueError(f"the tokenizer encodes <|user|> as {len(ids)} tokens, not one special token")
    return int(ids[0])


def _trigrams(ids: Sequence[int]) -> set[tuple[int, int, int]]:
    return {(ids[i], ids[i + 1], ids[i + 2]) for i in range(len(ids) - 2)}


def format_token_ids(tokenizer: Any) -> frozenset[int]:
    """The ids of tool-call syntax (tags, parameter names, the common tool names), newline and
    ``<|end|>``: never counted as copies, wherever they occur."""
    from agent.parser import encode_call

    params = {p: "" for p in ("path", "search", "replace", "pattern", "command", "content", "query")}
    ids = {t for name in ("read_file", "edit_file", "write_file", "grep", "run_command", "search")
           for t in tokenizer.encode(encode_call(name, params))}
    return frozenset(ids | set(tokenizer.encode("\n")) | {tokenizer.end_id})


def copy_flags(example: Sequence[Segment], user_id: int, format_ids: frozenset[int] = frozenset()) -> list[bool]:
    """Per token of the flattened ``example``: whether it is a sampled copy token (see the module
    docstring). The system prompt is the first segment up to its first ``user_id`` token; tokens in
    ``format_ids`` (:func:`format_token_ids`) are never copies."""
    flat = [t for s in example for t in s.token_ids]
    first = list(example[0].token_ids) if example else []
    system = first[: first.index(user_id)] if user_id in first else []
    banned = _trigrams(system)
    seen: set[tuple[int, int, int]] = set()
    out: list[bool] = []
    pos = 0
    for seg in example:
        n = len(seg.token_ids)
        if seg.sampled:
            out += [j >= 2 and flat[j] not in format_ids
                    and (tri := (flat[j - 2], flat[j - 1], flat[j])) in seen and tri not in banned
                    for j in range(pos, pos + n)]
        else:
            out += [False] * n
        # everything up to this segment's end is context for the next ones
        seen |= _trigrams(flat[max(0, pos - 2): pos + n])
        pos += n
    return out


def exit_flags(example: Sequence[Segment], copies: Sequence[bool]) -> list[bool]:
    """Per token of the flattened ``example``: whether it is an exit — sampled, not a copy, right
    after a copy (``copies``: :func:`copy_flags` of the same example)."""
    sampled = [s.sampled for s in example for _ in s.token_ids]
    if len(sampled) != len(copies):
        raise ValueError(f"copies has {len(copies)} flags for an example of {len(sampled)} tokens")
    return [t > 0 and sampled[t] and not copies[t] and copies[t - 1] for t in range(len(copies))]
