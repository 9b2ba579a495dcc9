"""Word lists for procedural tasks: one per split, disjoint by construction.

Every identifier, file and directory name a family invents is built from
the split's words (joined with ``_``), so the held-out split shares no
invented name with the training split and measures skill, not memory.
What both splits share is only the scaffold: Python keywords and builtins,
the ``unittest`` API, ``tests/`` and ``test_`` prefixes (:data:`SCAFFOLD`).

Not guaranteed: words are not disjoint from the *scaffold* by meaning (a
train word may resemble a builtin); a word list too short for a family's
difficulty raises instead of repeating names.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rl.types import Split

_POOL = Path(__file__).with_name("train_words.txt")
#: The training split's ~3,000 words (``train_words.txt``: code words from the stdlib, frozen). A broad
#: pool is the point: with the 30 words this module first had (still its first 30 entries), SFT on
#: the training split let a small model *memorise* every name it would write instead of learning to
#: copy a name from the request or a tool result into a call, and held-out tasks, whose names are all
#: new, need exactly that copy (docs/rl/runs.md: the first experiment's start solved none of them).
#: Standard-library module names (``enum``, ``json``, ``copy``: 108 of the file's words) are left out:
#: a task's package or module of that name shadows the module the grader's ``unittest`` imports, so
#: such tasks failed the build's grading check (``rl.tasks.build.validate``) and were dropped (13 of
#: 1,000 in a 1,000-task build).
TRAIN_WORDS: tuple[str, ...] = tuple(
    w for w in _POOL.read_text(encoding="utf-8").split("\n")
    if w and not w.startswith("#") and w not in sys.stdlib_module_names)
HELDOUT_WORDS: tuple[str, ...] = (
    "quartz", "falcon", "glacier", "tundra", "comet", "nebula", "prairie", "sierra", "coral", "bison",
    "lynx", "orbit", "pixel", "sonar", "tango", "umber", "violet", "wombat", "zephyr", "acorn",
    "badger", "cobalt", "delta", "equinox", "fjord", "gecko", "helium", "iris", "jasper", "kelp",
)
#: The validation split's words: disjoint from both others (and no word of either inside one), so
#: choosing a start by validation success rewards copying new names, as the held-out split does,
#: without reading the held-out split.
VALIDATION_WORDS: tuple[str, ...] = (
    "saffron", "marmot", "walrus", "heron", "lagoon", "basalt", "cinder", "fennel", "granite", "indigo",
    "juniper", "kestrel", "lichen", "mango", "nutmeg", "otter", "pebble", "thistle", "willow", "alder",
    "birch", "cypress", "dahlia", "egret", "ferret", "heather", "ibis", "jackal", "koala", "lemur",
)
assert not set(TRAIN_WORDS) & set(HELDOUT_WORDS)
assert not set(VALIDATION_WORDS) & (set(TRAIN_WORDS) | set(HELDOUT_WORDS))

SCAFFOLD = frozenset({
    "unittest", "TestCase", "self", "assertEqual", "assertTrue", "assertFalse", "assertIn", "assertNotIn",
    "main", "tests", "__init__", "__name__", "__main__", "os", "path", "join", "dirname", "abspath", "__file__",
    "open", "read", "walk", "root", "dirs", "files", "name", "text", "f", "len", "range", "sum", "max", "min",
    "sorted", "list", "dict", "str", "int", "items", "n", "x", "i", "v", "lo", "hi", "limit", "values",
    "default", "total", "ast", "definitions", "found", "fname", "node", "body", "parse", "Assign",
    "test_setting", "test_rename", "a", "b", "c", "one",
    "targets", "t", "id", "literal_eval", "value", "isinstance", "ROOT", "test_value", "test_new_name",
    "test_old_name_gone", "TestRename", "TestSetting", "append", "assertNotIn", "rename", "setting", "count", "word", "words", "split", "reversed", "get", "counts", "endswith", "NotImplementedError",
})


_WORDS: dict[Split, tuple[str, ...]] = {Split.TRAIN: TRAIN_WORDS, Split.HELDOUT: HELDOUT_WORDS,
                                        Split.VALIDATION: VALIDATION_WORDS}


def words_for(split: Split) -> tuple[str, ...]:
    return _WORDS[split]
