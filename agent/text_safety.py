"""Untrusted text: what every event may carry, and what a terminal may show.

Model output, command output and file names are untrusted. Two rules, each
decided once, here:

**JSON-safe (every event, by construction).** A Python ``str`` may hold lone
surrogates, which UTF-8 (and so JSON on the wire, the session log, a
terminal) cannot encode. They come from two places:

* file names and command output decoded with ``os.fsdecode`` /
  ``surrogateescape``, where U+DC80..U+DCFF stands for a raw byte
  0x80..0xFF that is not valid UTF-8 (a file named ``b"\\xff.txt"`` is
  ``"\\udcff.txt"``). :func:`json_safe_text` writes such a byte as the four
  visible characters ``\\xff`` -- the same form Python's ``backslashreplace``
  gives, so ``\\xff.txt`` reads as what it is and can be mapped back to the
  byte;
* anything else (a model server that sent a ``"\\ud800"`` JSON escape): a
  valid high+low pair becomes the character it encodes, every other lone
  surrogate becomes U+FFFD, since there is no byte behind it to preserve.

It is the spelling the file tools use too (``tools.paths.display_path``),
and the path layer accepts it back (``tools.paths.fs_path``), so a name read
from an event addresses the file.

Not guaranteed: the ``\\xNN`` form is not injective -- a name that really
contains the four characters backslash, ``x``, ``f``, ``f`` looks the same.

**Inert on a terminal.** :func:`inert` makes text safe to write to a terminal:
C0 controls except ``\\n`` and ``\\t`` are shown in caret notation (ESC is
``^[``, BEL ``^G``), a bare ``\\r`` (one not followed by ``\\n``, which could
return to the line start and overwrite it) as ``^M``, DEL as ``^?``, C1
controls (U+0080..U+009F, which some terminals treat as ESC sequences) as
``\\x9b``, and the bidirectional overrides, embeddings, isolates and marks
that reorder what is displayed ("Trojan Source": U+202A..U+202E,
U+2066..U+2069, U+200E, U+200F, U+061C) as ``\\u202e``. Printable text,
including any non-ASCII script, is unchanged. Callers add their own colour
codes *after* calling it. :func:`escape_json_text` applies the same idea to
JSON text, using JSON's own ``\\uXXXX`` escapes, so ``--json`` output stays
exact JSON and is still inert when it reaches a terminal.

Not guaranteed: terminals differ; this covers the sequences that move the
cursor, set titles, write the clipboard (OSC 52), clear the screen or
reorder text. It does not hide confusable characters (homoglyphs) or
zero-width spaces, and wide characters may still misalign columns.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Mapping
from typing import Any

MAX_DEPTH = 32
"""Containers nested deeper than this in an event's ``args``/``data`` are replaced by a marker string."""

_SURROGATES = re.compile("[\ud800-\udbff][\udc00-\udfff]|[\ud800-\udfff]")


def _surrogate(m: re.Match[str]) -> str:
    s = m.group()
    if len(s) == 2:  # a UTF-16 pair held as two code points: the character it encodes
        return chr(0x10000 + ((ord(s[0]) - 0xD800) << 10) + (ord(s[1]) - 0xDC00))
    cp = ord(s)
    if 0xDC80 <= cp <= 0xDCFF:  # surrogateescape: the raw byte cp - 0xDC00
        return f"\\x{cp - 0xDC00:02x}"
    return "\ufffd"


def json_safe_text(text: str) -> str:
    """``text`` with every surrogate replaced as described in the module docstring.

    The result always encodes as UTF-8. Text without surrogates is returned
    unchanged (the same object).
    """
    if text.isascii():  # fast paths: a regex scan costs ~5 ns a character, these far less
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return _SURROGATES.sub(_surrogate, text)


def json_safe_value(value: Any, _depth: int = 0) -> Any:
    """A JSON-serialisable copy of ``value`` whose strings are :func:`json_safe_text`.

    Dicts keep their order with keys made strings; lists, tuples and sets
    become lists; ``bytes`` are decoded as UTF-8 with ``surrogateescape`` (so
    invalid bytes show as ``\\xNN``); paths become strings; enums their value;
    ``None``, booleans, ints and floats are kept (a non-finite float is
    written as ``null`` by the JSON encoder). Anything else becomes its
    ``repr`` -- a tool that put an arbitrary object into ``data`` gets a
    readable string, not a crash. Containers deeper than :data:`MAX_DEPTH`
    (or cyclic) become the string ``"<nested too deep>"``.
    """
    if isinstance(value, str):
        return json_safe_text(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if _depth >= MAX_DEPTH:
        return "<nested too deep>"
    if isinstance(value, Mapping):
        return {json_safe_text(k if isinstance(k, str) else str(k)): json_safe_value(v, _depth + 1)
                for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe_value(v, _depth + 1) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return json_safe_text(bytes(value).decode("utf-8", "surrogateescape"))
    if isinstance(value, os.PathLike):
        return json_safe_text(os.fsdecode(value))
    if isinstance(value, enum.Enum):
        return json_safe_value(value.value, _depth + 1)
    return json_safe_text(repr(value))


# ------------------------------------------------------------------ terminal

_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_INERT = re.compile(f"\r\n|[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}\ud800-\udfff]")
_JSON_ACTIVE = re.compile(f"[\x7f-\x9f{_BIDI}\u2028\u2029]")


def _inert(m: re.Match[str]) -> str:
    s = m.group()
    if s == "\r\n":
        return "\n"
    cp = ord(s)
    if cp < 0x20:
        return "^" + chr(cp + 0x40)
    if cp == 0x7F:
        return "^?"
    if cp <= 0x9F:
        return f"\\x{cp:02x}"
    return f"\\u{cp:04x}"


def inert(text: str) -> str:
    """``text`` made safe to write to a terminal (see the module docstring).

    ``\\n`` and ``\\t`` are kept, ``\\r\\n`` becomes ``\\n``; nothing else the
    terminal would act on survives. Idempotent on its own output except
    that it never adds controls (``^[`` is two printable characters).
    """
    return _INERT.sub(_inert, text)


def escape_json_text(json_text: str) -> str:
    """Escape, inside serialised JSON, the characters JSON leaves raw but a
    terminal acts on (DEL, C1 controls, bidi controls, U+2028/U+2029) as
    ``\\uXXXX``.

    The JSON still decodes to exactly the same value: these characters can
    only occur inside string literals, where ``\\uXXXX`` means the same.
    C0 controls are already escaped by any JSON encoder.
    """
    if json_text.isascii() and "\x7f" not in json_text:  # DEL is ASCII
        return json_text
    raw = json_text.encode("utf-8", "surrogatepass")
    # UTF-8 lead bytes of every character in _JSON_ACTIVE: DEL; U+0080..U+009F (C2 80..9F);
    # U+061C (D8 9C); U+200E..U+202E, U+2066..U+2069 (E2 80 / E2 81). A bytes search is memchr-fast.
    if b"\x7f" not in raw and b"\xc2" not in raw and b"\xd8\x9c" not in raw and b"\xe2\x80" not in raw \
            and b"\xe2\x81" not in raw:
        return json_text
    return _JSON_ACTIVE.sub(lambda m: f"\\u{ord(m.group()):04x}", json_text)
