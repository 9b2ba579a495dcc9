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

from rl.types import Split

TRAIN_WORDS: tuple[str, ...] = (
    "apple", "river", "stone", "cloud", "maple", "amber", "cedar", "ember", "grove", "harbor",
    "island", "jungle", "lantern", "meadow", "nectar", "orchid", "pepper", "quill", "raven", "saddle",
    "timber", "velvet", "walnut", "yarrow", "basil", "copper", "dune", "fern", "garnet", "hazel",
)
HELDOUT_WORDS: tuple[str, ...] = (
    "quartz", "falcon", "glacier", "tundra", "comet", "nebula", "prairie", "sierra", "coral", "bison",
    "lynx", "orbit", "pixel", "sonar", "tango", "umber", "violet", "wombat", "zephyr", "acorn",
    "badger", "cobalt", "delta", "equinox", "fjord", "gecko", "helium", "iris", "jasper", "kelp",
)
assert not set(TRAIN_WORDS) & set(HELDOUT_WORDS)

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


def words_for(split: Split) -> tuple[str, ...]:
    return TRAIN_WORDS if split is Split.TRAIN else HELDOUT_WORDS
