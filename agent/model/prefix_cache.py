"""Prefix reuse for the generation engine: which tokens each KV-cache slot holds.

The engine's KV cache is a fixed block of slots (``agent.model.transformer.KVCache``).
A slot keeps its keys and values after its sequence ends; :class:`SlotTable`
remembers which tokens they belong to, so a new request whose prompt starts
with those tokens computes only the rest:

* the G samples of one task share their prompt: the first is prefilled, the
  others copy its keys/values (a tensor copy, no forward);
* every turn of a conversation extends the previous one: the slot that held
  the previous turn (prompt + sampled tokens) is taken again and only the new
  suffix (the last sampled token, the tool results, the next assistant marker)
  is computed.

Placement (:meth:`SlotTable.acquire`): the longest common token prefix over
every slot whose contents are valid. If that slot is free, the request takes
it (its stale tail is overwritten); if it is busy, the request gets the least
recently released free slot and the prefix is copied. At least one prompt
token is always computed (its logits give the first sampled token). A request
whose best match is a slot still being prefilled in the same admission round
is deferred to the next round, so identical prompts admitted together are
computed once.

The match is on token ids, never on text. Not guaranteed: hits across weight
updates (:meth:`SlotTable.invalidate` drops every slot's contents when the
engine loads new weights), or any bound on hit rate: with more live
conversations than slots, slots are reused least-recently-released first and
their prefixes are lost.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a new sequence goes: its ``slot``, and the first ``keep`` prompt tokens
    already cached there — in the slot itself (``source`` None) or in ``source``,
    from which they are copied before the prefill."""

    slot: int
    keep: int
    source: int | None = None


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class SlotTable:
    """The token ids whose keys/values each slot holds (``tokens[slot]``, one per
    cached position), the free slots in release order, and which slots may be
    matched. Used by one engine loop; not thread-safe."""

    def __init__(self, max_slots: int, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.tokens: list[list[int]] = [[] for _ in range(max_slots)]
        self._ready = [False] * max_slots  # tokens[slot] are all computed (not mid-prefill, not failed)
        self._epoch = 0  # bumped by invalidate(): contents from an older epoch are never matched
        self._epoch_of = [0] * max_slots
        self.free: list[int] = list(range(max_slots))  # least recently released first
        self._intent: dict[int, list[int]] = {}  # slots being prefilled this round → their prompts

    def acquire(self, prompt: list[int]) -> Placement | None:
        """Place ``prompt`` in a free slot (there must be one), or None to defer it:
        a slot being prefilled this round will hold a longer prefix of it."""
        best_slot, best = -1, 0
        if self.enabled:
            for slot, toks in enumerate(self.tokens):
                if self.valid(slot):
                    m = common_prefix(toks, prompt)
                    if m > best or (m == best and m > 0 and slot in self.free and best_slot not in self.free):
                        best_slot, best = slot, m
            if any(common_prefix(p, prompt) > best for p in self._intent.values()):
                return None
        keep = min(best, len(prompt) - 1)
        if keep <= 0:
            placement = Placement(self.free.pop(0), 0)
        elif best_slot in self.free:
            self.free.remove(best_slot)
            placement = Placement(best_slot, keep)
        else:
            placement = Placement(self.free.pop(0), keep, best_slot)
        source = placement.slot if placement.source is None else placement.source
        self.tokens[placement.slot] = self.tokens[source][: placement.keep]
        self._ready[placement.slot] = False  # until its prefill has run
        self._epoch_of[placement.slot] = self._epoch
        self._intent[placement.slot] = prompt
        return placement

    def valid(self, slot: int) -> bool:
        """``tokens[slot]`` are cached there, computed with the current weights."""
        return self._ready[slot] and self._epoch_of[slot] == self._epoch

    def end_round(self) -> None:
        """The admission round is over: nothing is pending any more."""
        self._intent.clear()

    def fed(self, slot: int, tokens: list[int]) -> None:
        """A forward computed ``tokens`` at the end of ``slot``: they are cached now."""
        self.tokens[slot] += tokens
        self._intent.pop(slot, None)
        self._ready[slot] = True

    def release(self, slot: int) -> None:
        """The slot's sequence is over; its contents stay matchable until it is reused."""
        if slot not in self.free:
            self.free.append(slot)

    def forget(self, slot: int) -> None:
        """The slot's contents are unknown (a failed forward): never match them."""
        self._ready[slot] = False
        self.tokens[slot] = []
        self._intent.pop(slot, None)

    def invalidate(self) -> None:
        """New weights: no key/value cached so far is valid any more (sequences
        still running keep decoding; their slots are not matched again)."""
        self._epoch += 1

    @property
    def n_free(self) -> int:
        return len(self.free)
