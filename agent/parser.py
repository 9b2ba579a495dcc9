"""Incremental parser for the XML tool-call format (see ``docs/tool-format.md``).

Feed it the model's output in chunks of any size (down to one byte with
:meth:`StreamParser.feed_bytes`); it returns events as soon as they are
certain:

* :class:`TextDelta` — assistant text outside tool calls,
* :class:`CallOpened` — a ``<tool_call name="...">`` opening tag was read,
* :class:`ParamDelta` — part of a parameter body while it streams (for live
  edit previews; the call does not run until it is complete),
* :class:`ParsedCall` — a complete call, emitted the instant its closing tag's
  ``>`` arrives,
* :class:`MalformedCall` — a call that cannot be read (bad tag, garbage inside
  the call, unclosed at end of stream); it still takes a call index so that
  results go back to the model in call order.

Guarantees: the concatenated text deltas and the sequence of calls do not
depend on how the stream is split; total work is linear in the stream length
(the parser only ever holds back a bounded tail: at most one tag of
``max_tag_chars`` or one terminator's length). The parser never raises on any
input; it does not know the tool schemas (see ``agent.calls`` for that).

Not guaranteed: the *split* of text into deltas follows the chunking; a
literal ``<tool_call`` in prose always starts a call (there is no escape for
it outside a parameter body); a broken call's partial-parameter deltas stop
at the point it broke.
"""

from __future__ import annotations

import codecs
import enum
import functools
from dataclasses import dataclass

from lxml import etree

CALL_OPEN = "<tool_call"
CALL_CLOSE = "</tool_call>"
PARAM_OPEN = "<param"
PARAM_CLOSE = "</param>"
CDATA_OPEN = "<![CDATA["
CDATA_CLOSE = "]]>"
_TAG_END_CHARS = " \t\r\n>/"
_EXCERPT = "\x00excerpt\x00"  # placeholder in failure messages, filled when the call ends
_EXCERPT_CHARS = 40


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class CallOpened:
    index: int
    name: str


@dataclass(frozen=True, slots=True)
class ParamDelta:
    index: int
    param: str
    text: str


@dataclass(frozen=True, slots=True)
class ParsedCall:
    """A syntactically complete call. Parameters keep their order and duplicates."""

    index: int
    name: str
    params: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class MalformedCall:
    index: int
    name: str | None
    message: str


ParseEvent = TextDelta | CallOpened | ParamDelta | ParsedCall | MalformedCall


class _State(enum.Enum):
    TEXT = enum.auto()
    OPEN_TAG = enum.auto()
    CALL_BODY = enum.auto()
    PARAM_TAG = enum.auto()
    PARAM_BODY = enum.auto()
    CDATA = enum.auto()
    GARBAGE = enum.auto()  # stray text inside a call, up to the next "<"
    SKIP_TAG = enum.auto()  # a stray or oversized tag inside a call, up to its ">"
    DONE = enum.auto()


# One parser object per process is fine: lxml parsers are reusable, and this
# one can neither load a DTD, expand an entity, nor touch the network.
_TAG_PARSER = etree.XMLParser(
    resolve_entities=False,
    no_network=True,
    load_dtd=False,
    dtd_validation=False,
    huge_tree=False,
)

_FORM_HINT = (
    'expected <tool_call name="TOOL"> followed by <param name="NAME">value</param> '
    "elements and </tool_call>"
)


@functools.lru_cache(maxsize=4096)
def parse_tag_name(tag: str) -> tuple[str | None, str | None]:
    """Read the ``name`` attribute of a complete opening tag with lxml.

    Returns ``(name, None)`` or ``(None, error message)``. Entities are not
    expanded and no DTD is consulted, so ``&xxe;`` is an error, never a fetch.
    Memoised (a pure function of the tag): models repeat the same few tags, and
    each lxml parse releases the GIL, which in a server with busy threads costs
    the event loop far more than the parse.
    """
    body = tag[:-2] if tag.endswith("/>") else tag[:-1]
    try:
        element = etree.fromstring(body + "/>", _TAG_PARSER)
    except etree.XMLSyntaxError as exc:
        return None, f"could not read the tag {tag[:120]!r}: {exc.msg}"
    name = element.get("name")
    extra = sorted(set(element.attrib) - {"name"})
    if extra:
        return None, f"unexpected attribute(s) {', '.join(extra)} in {tag[:120]!r}"
    if not name or not name.strip():
        return None, f'the tag {tag[:120]!r} has no name="..." attribute'
    return name.strip(), None


class StreamParser:
    """Parse one model response incrementally. Not thread-safe; one per response.

    A call with an error (bad tag, stray text, too large) is still parsed to
    its closing tag, respecting parameter bodies and CDATA, so that text
    inside a broken call's parameters can never be mistaken for a call; it is
    then reported as one :class:`MalformedCall`.
    """

    def __init__(self, *, max_tag_chars: int = 1024, max_call_chars: int = 16 * 1024 * 1024):
        self.max_tag_chars = max_tag_chars
        self.max_call_chars = max_call_chars
        self._buf = ""
        self._pos = 0  # read position in _buf; everything before it is consumed
        self._scan_from = 0  # resume offset for the '>' search inside a tag
        self._state = _State.TEXT
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._index = -1
        self._reset_call()

    def _reset_call(self) -> None:
        self._call_name: str | None = None
        self._params: list[tuple[str, str]] = []
        self._param_name: str | None = None
        self._param_parts: list[str] = []
        self._call_chars = 0
        self._error: str | None = None  # first problem of this call (may hold _EXCERPT)
        self._excerpt = ""  # text quoted in that message
        self._after_tag = _State.CALL_BODY  # where SKIP_TAG returns to

    # -- public API -------------------------------------------------------

    def feed_bytes(self, data: bytes) -> list[ParseEvent]:
        """Feed raw UTF-8 bytes split anywhere (even inside a code point)."""
        return self.feed(self._decoder.decode(data))

    def feed(self, chunk: str) -> list[ParseEvent]:
        out: list[ParseEvent] = []
        if not chunk or self._state is _State.DONE:
            return out
        if self._pos:
            self._buf = self._buf[self._pos :]
            self._scan_from = max(0, self._scan_from - self._pos)
            self._pos = 0
        self._buf += chunk
        self._run(out)
        return out

    def finish(self) -> list[ParseEvent]:
        """End of stream: flush held-back text, report an unclosed call."""
        out: list[ParseEvent] = []
        if self._state is _State.DONE:
            return out
        tail = self._decoder.decode(b"", final=True)
        if tail:
            out.extend(self.feed(tail))
        rest = self._buf[self._pos :]
        if self._state is _State.TEXT:
            if rest:
                out.append(TextDelta(rest))
        else:
            what = f"<tool_call name={self._call_name!r}>" if self._call_name else "<tool_call>"
            unclosed = f"unclosed {what}: the response ended before </tool_call>"
            first = self._error_message()
            message = f"{first}; and {unclosed}" if first else f"{unclosed}; {_FORM_HINT}"
            out.append(MalformedCall(self._index, self._call_name, message))
        self._buf, self._pos = "", 0
        self._state = _State.DONE
        return out

    # -- the state machine -------------------------------------------------
    # Each step reads from self._pos, advances it past what it consumed and
    # returns True, or returns False when it needs more input. The buffer is
    # only compacted once per feed(), so scanning stays linear.

    def _run(self, out: list[ParseEvent]) -> None:
        step = {
            _State.TEXT: self._text,
            _State.OPEN_TAG: self._open_tag,
            _State.CALL_BODY: self._call_body,
            _State.PARAM_TAG: self._param_tag,
            _State.PARAM_BODY: self._param_body,
            _State.CDATA: self._cdata,
            _State.GARBAGE: self._garbage,
            _State.SKIP_TAG: self._skip_tag,
        }
        while self._pos < len(self._buf) and step[self._state](out):
            pass

    def _take(self, end: int) -> str:
        piece = self._buf[self._pos : end]
        self._pos = end
        return piece

    def _fail(self, message: str) -> None:
        """Record the call's first problem; parsing of the call goes on."""
        if self._error is None:
            self._error = message

    def _error_message(self) -> str | None:
        if self._error is None:
            return None
        return self._error.replace(_EXCERPT, repr(self._excerpt[:_EXCERPT_CHARS]))

    def _text(self, out: list[ParseEvent]) -> bool:
        buf, pos = self._buf, self._pos
        lt = buf.find("<", pos)
        while lt >= 0:
            verdict = _starts_tag(buf, lt, CALL_OPEN)
            if verdict is None:
                break  # could still become "<tool_call": hold back from here
            if verdict:
                if lt > pos:
                    out.append(TextDelta(self._take(lt)))
                self._index += 1
                self._reset_call()
                self._scan_from = lt + len(CALL_OPEN)
                self._state = _State.OPEN_TAG
                return True
            lt = buf.find("<", lt + 1)
        end = len(buf) if lt < 0 else lt
        if end > pos:
            out.append(TextDelta(self._take(end)))
        return False

    def _read_tag(self, what: str) -> str | None:
        """A complete tag starting at self._pos, or None: more input needed, or
        (state changed to SKIP_TAG) the tag is too long."""
        buf, start = self._buf, self._pos
        gt = buf.find(">", self._scan_from)
        limit = start + self.max_tag_chars
        if gt < 0 and len(buf) <= limit:
            self._scan_from = len(buf)
            return None
        if gt < 0 or gt >= limit:
            self._fail(f"the {what} tag is longer than {self.max_tag_chars} characters")
            self._state = _State.SKIP_TAG
            return None
        return self._take(gt + 1)

    def _open_tag(self, out: list[ParseEvent]) -> bool:
        tag = self._read_tag("<tool_call>")
        if tag is None:
            return self._state is not _State.OPEN_TAG
        name, error = parse_tag_name(tag)
        if error:
            self._fail(error)
        else:
            self._call_name = name
            out.append(CallOpened(self._index, name))
        if tag.endswith("/>"):
            self._complete(out)
        else:
            self._state = _State.CALL_BODY
        return True

    def _call_body(self, out: list[ParseEvent]) -> bool:
        buf, pos = self._buf, self._pos
        while pos < len(buf) and buf[pos] in " \t\r\n":
            pos += 1
        self._pos = pos
        if pos == len(buf):
            return False
        if buf[pos] != "<":
            self._fail(f"unexpected text {_EXCERPT} inside the call; {_FORM_HINT}")
            self._state = _State.GARBAGE
            return True
        opens = _starts_tag(buf, pos, PARAM_OPEN)
        if opens:
            self._scan_from = pos + len(PARAM_OPEN)
            self._state = _State.PARAM_TAG
            return True
        close = _starts_close(buf, pos, CALL_CLOSE)
        if close:
            self._pos = pos + close
            self._complete(out)
            return True
        if opens is None or close is None:
            return False
        self._fail(f"unexpected tag {_EXCERPT} inside the call; {_FORM_HINT}")
        self._scan_from = pos
        self._after_tag = _State.CALL_BODY
        self._state = _State.SKIP_TAG
        return True

    def _collect_excerpt(self, end: int) -> None:
        if self._error is not None and _EXCERPT in self._error and len(self._excerpt) < _EXCERPT_CHARS:
            self._excerpt += self._buf[self._pos : min(end, self._pos + _EXCERPT_CHARS)]

    def _garbage(self, out: list[ParseEvent]) -> bool:
        lt = self._buf.find("<", self._pos)
        end = len(self._buf) if lt < 0 else lt
        self._collect_excerpt(end)
        self._pos = end
        if lt < 0:
            return False
        self._state = _State.CALL_BODY
        return True

    def _skip_tag(self, out: list[ParseEvent]) -> bool:
        gt = self._buf.find(">", self._pos)
        end = len(self._buf) if gt < 0 else gt + 1
        self._collect_excerpt(end)
        self._pos = end
        if gt < 0:
            return False
        self._state = self._after_tag
        return True

    def _param_tag(self, out: list[ParseEvent]) -> bool:
        tag = self._read_tag("<param>")
        if tag is None:
            if self._state is _State.SKIP_TAG:
                self._after_tag = _State.PARAM_BODY  # skip the tag, then its body
                self._param_name = None
            return self._state is not _State.PARAM_TAG
        name, error = parse_tag_name(tag)
        if error:
            self._fail(error)
        self._param_name = name
        self._param_parts = []
        if tag.endswith("/>"):
            if name is not None:
                self._params.append((name, ""))
            self._state = _State.CALL_BODY
        else:
            self._state = _State.PARAM_BODY
        return True

    def _param_text(self, out: list[ParseEvent], end: int) -> None:
        """Consume buf[pos:end] as parameter text (kept only while the call is sound)."""
        n = end - self._pos
        if n <= 0:
            return
        if self._error is None and self._call_chars + n > self.max_call_chars:
            keep = self.max_call_chars - self._call_chars
            self._param_text(out, self._pos + keep)  # exactly up to the cap, whatever the chunking
            self._fail(f"the call is larger than {self.max_call_chars} characters")
        text = self._take(end)
        if self._error is not None or self._param_name is None:
            return
        self._call_chars += n
        self._param_parts.append(text)
        out.append(ParamDelta(self._index, self._param_name, text))

    def _param_body(self, out: list[ParseEvent]) -> bool:
        buf = self._buf
        lt = buf.find("<", self._pos)
        while lt >= 0:
            if buf.startswith(PARAM_CLOSE, lt):
                self._param_text(out, lt)
                self._pos = lt + len(PARAM_CLOSE)
                if self._param_name is not None:
                    self._params.append((self._param_name, "".join(self._param_parts)))
                self._param_parts = []
                self._state = _State.CALL_BODY
                return True
            if buf.startswith(CDATA_OPEN, lt):
                self._param_text(out, lt)
                self._pos = lt + len(CDATA_OPEN)
                self._state = _State.CDATA
                return True
            rest = buf[lt : lt + len(CDATA_OPEN)]
            if PARAM_CLOSE.startswith(rest) or CDATA_OPEN.startswith(rest):
                break  # a terminator may be arriving: hold back from here
            lt = buf.find("<", lt + 1)
        self._param_text(out, len(buf) if lt < 0 else lt)
        return False

    def _cdata(self, out: list[ParseEvent]) -> bool:
        buf = self._buf
        end = buf.find(CDATA_CLOSE, self._pos)
        if end >= 0:
            self._param_text(out, end)
            self._pos = end + len(CDATA_CLOSE)
            self._state = _State.PARAM_BODY
            return True
        keep = 2 if buf.endswith("]]") else 1 if buf.endswith("]") else 0
        self._param_text(out, max(self._pos, len(buf) - keep))
        return False

    def _complete(self, out: list[ParseEvent]) -> None:
        message = self._error_message()
        if message is not None:
            out.append(MalformedCall(self._index, self._call_name, message))
        else:
            assert self._call_name is not None
            out.append(ParsedCall(self._index, self._call_name, tuple(self._params)))
        self._reset_call()
        self._state = _State.TEXT


def _starts_tag(buf: str, at: int, opener: str) -> bool | None:
    """Does ``buf[at:]`` start with the tag ``opener``? None: undecidable yet."""
    n = len(opener)
    if len(buf) - at <= n:
        return None if opener.startswith(buf[at:]) else False
    return buf.startswith(opener, at) and buf[at + n] in _TAG_END_CHARS


def _starts_close(buf: str, at: int, closer: str) -> int | None:
    """Length of a closing tag (``</x>``, ``</x >``) at ``buf[at:]``.

    0 when it is not one, None when more input is needed to decide.
    """
    stem = closer[:-1]
    if len(buf) - at < len(stem):
        return None if stem.startswith(buf[at:]) else 0
    if not buf.startswith(stem, at):
        return 0
    i = at + len(stem)
    while i < len(buf) and buf[i] in " \t\r\n" and i < at + len(stem) + 16:
        i += 1
    if i == len(buf):
        return None
    return i + 1 - at if buf[i] == ">" else 0


def encode_param(value: str) -> str:
    """Encode a parameter value so that the parser returns it byte-exact.

    Raw text when that is unambiguous, otherwise CDATA sections (a value
    containing ``]]>`` is split across sections, as XML does).
    """
    if PARAM_CLOSE not in value and CDATA_OPEN not in value:
        return value
    return CDATA_OPEN + value.replace(CDATA_CLOSE, "]]" + CDATA_CLOSE + CDATA_OPEN + ">") + CDATA_CLOSE


def encode_call(name: str, params: list[tuple[str, str]] | dict[str, str]) -> str:
    """Render a call in the wire format (used by tests, docs and scripted policies)."""
    items = params.items() if isinstance(params, dict) else params
    body = "".join(f'<param name="{k}">{encode_param(v)}</param>\n' for k, v in items)
    return f'<tool_call name="{name}">\n{body}</tool_call>'
