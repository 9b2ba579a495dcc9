"""Name-swap augmentation of SFT demonstrations: a recorded transcript with the task's
invented names consistently replaced by fresh ones.

Why: every procedural task's names come from the training split's words, and held-out tasks
use other words, so a policy succeeds on held-out tasks only by *copying* names from its
request and tool results into its calls. With a few hundred real demonstrations a small
model lowers its SFT loss faster by memorising which training words tend to appear than by
learning to copy (docs/rl/runs.md: the SFT start wrote invented paths such as
``shifted/shifted.py`` for ``iris/umber.py``). A transcript whose names are random letter
strings cannot be memorised: each renamed copy is new, and the loss on its names falls only
by copying. This is the identifier-renaming augmentation code models use; it is a departure
from the issue's "demonstrations recorded through the runtime" only in that the renamed
copies are not re-run — each is checked instead (below).

How a renaming is checked: the task's draft is generated again with the task's word list
rewritten by the same mapping (:func:`rl.tasks.families.generate` with ``words=``; the
generator draws the same positions, so the structure is identical) and the text substitution
must turn the task's own request and start files into exactly the regenerated ones.
A task whose names collide with the scaffold (Python keywords and builtins, the ``unittest``
API, the system prompt's and tool schemas' words) is never renamed.

Not guaranteed: that a renamed transcript is byte-identical to what the runtime would have
produced for the renamed task where tool output depends on name order (``grep`` results are
sorted by path, so a renamed search may list its hits in another order than a real run).
Only the text after the system prompt is renamed; the system prompt is never touched.
"""

from __future__ import annotations

import builtins
import dataclasses
import keyword
import random
import re
import string
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from rl.tasks.vocab import HELDOUT_WORDS, SCAFFOLD, TRAIN_WORDS, VALIDATION_WORDS

if TYPE_CHECKING:
    from rl.tasks.spec import Task
    from rl.train.demos import Demonstration

__all__ = ["apply_renaming", "rename_demo", "renamed_words", "renaming_for"]

_LETTERS = re.compile(r"[A-Za-z]+")
#: words of the fixed text around the names (scripted phrases, unittest and shell output) that a
#: renaming must never touch; with :data:`SCAFFOLD`, keywords, builtins and the system prompt's words
_FIXED = frozenset(_LETTERS.findall(
    "Let me look at the code first. I'll inspect the relevant files. Checking the code. The fix is in and "
    "the tests pass. Done: the change is made and the tests pass. That edit did not match; reading the file. "
    "guessed Ran test tests in OK FAILED failures errors error exit code status stdout stderr Traceback most "
    "recent call last File line module AssertionError ImportError ModuleNotFoundError NameError "
    "AttributeError SyntaxError ERROR FAIL python python3 unittest discover true false none null sed py"))
_CHAT_START = "<|user|>"
_POOL_SET = frozenset(TRAIN_WORDS)


def _random_word(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 8)))


def _protected(system_text: str) -> frozenset[str]:
    return frozenset({w.lower() for w in _LETTERS.findall(system_text)} | {w.lower() for w in SCAFFOLD}
                     | {w.lower() for w in _FIXED} | set(keyword.kwlist) | {w.lower() for w in dir(builtins)})


def _pattern(mapping: Mapping[str, str]) -> tuple[re.Pattern[str], dict[str, str]]:
    forms: dict[str, str] = {}
    for old, new in mapping.items():
        forms[old], forms[old.upper()], forms[old.capitalize()] = new, new.upper(), new.capitalize()

    def alts(words: Iterable[str]) -> str:
        return "|".join(sorted(map(re.escape, words), key=len, reverse=True))

    plain = alts([*mapping, *(w.upper() for w in mapping)])
    caps = alts(w.capitalize() for w in mapping)
    # a name ends at a non-letter (``_``, ``/``, ``.``, digits); a Capitalised form may follow a
    # lower-case letter (``TestBison``) but not an upper-case one, and never runs on in lower case
    return re.compile(rf"(?<![A-Za-z])(?:{plain})(?![A-Za-z])|(?<![A-Z])(?:{caps})(?![a-z])"), forms


def apply_renaming(text: str, mapping: Mapping[str, str]) -> str:
    """``text`` with every whole-word occurrence of each name (lower, UPPER, Capitalised) replaced."""
    if not mapping:
        return text
    pat, forms = _pattern(mapping)
    return pat.sub(lambda m: forms[m.group(0)], text)


#: words SFT must never write: the held-out and validation splits'
_UNSEEN = HELDOUT_WORDS + VALIDATION_WORDS


def _fresh(rng: random.Random, avoid: set[str], pool_share: float) -> str:
    while True:
        w = rng.choice(TRAIN_WORDS) if rng.random() < pool_share else _random_word(rng)
        if w in avoid or any(h in w for h in _UNSEEN) or "_" in w or not w.isalpha():
            continue
        avoid.add(w)
        return w


def renaming_for(task: Task, rng: random.Random, *, system_text: str = "",
                 pool_share: float = 0.3) -> dict[str, str] | None:
    """A checked mapping from ``task``'s names to fresh ones (``pool_share`` of them other training words,
    the rest random letters; never a held-out or validation word or one containing it), or None when the task cannot be
    renamed safely (no recorded names, a name in the scaffold, or a substitution the regenerated task
    contradicts)."""
    from rl.tasks.families import FAMILIES, generate
    from rl.tasks.spec import GeneratedSource
    from rl.types import Split

    words = task.metadata.get("words") if isinstance(task.metadata, dict) else None
    if task.family not in FAMILIES or not words or task.split is not Split.TRAIN:
        return None
    protected = _protected(system_text)
    if any(w.lower() in protected for w in words):
        return None
    avoid = set(words) | protected
    mapping = {w: _fresh(rng, avoid, pool_share) for w in words}
    try:
        draft = generate(task.family, task.split, task.seed, task.difficulty, words=renamed_words(mapping))
    except (ValueError, TypeError):
        return None
    files = task.source.files if isinstance(task.source, GeneratedSource) else None
    if files is None or apply_renaming(task.request, mapping) != draft.request:
        return None
    # the task's own start files (what its demonstrations read), renamed, must be the regenerated ones
    if {apply_renaming(p, mapping): apply_renaming(t, mapping) for p, t in files.items()} != draft.files:
        return None
    return mapping



def renamed_words(mapping: Mapping[str, str]) -> tuple[str, ...]:
    """The training word list with ``mapping`` applied position by position: what
    :func:`rl.tasks.families.generate` (``words=``) turns into the renamed task. A fresh word that
    is itself a pool word swaps places with the name it replaces, so the list keeps distinct entries
    (and the generator draws the same positions)."""
    swap = {new: old for old, new in mapping.items() if new in _POOL_SET}
    return tuple(mapping.get(w, swap.get(w, w)) for w in TRAIN_WORDS)


def rename_demo(demo: Demonstration, mapping: Mapping[str, str]) -> Demonstration:
    """``demo`` with ``mapping`` applied to its outputs and to every prompt after the system prompt."""

    def after_system(text: str) -> str:
        i = text.find(_CHAT_START)
        return text if i < 0 else text[:i] + apply_renaming(text[i:], mapping)

    prompts = [dataclasses.replace(p, text=after_system(p.text), messages=[]) for p in demo.prompts]
    return dataclasses.replace(demo, task_id=f"{demo.task_id}~renamed", prompts=prompts,
                               outputs=[apply_renaming(o, mapping) for o in demo.outputs], events=[])
