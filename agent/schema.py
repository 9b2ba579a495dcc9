"""RELAX NG grammars generated from the tool schemas, checked with lxml.

``agent.calls`` builds each parsed call as an lxml element and validates it
against the grammar of its tool: names, required/optional parameters (each at
most once, any order) and datatypes (XSD ``long``; booleans as an explicit
list of spellings), all
derived from the same :class:`tools.base.ToolSpec` that renders the prompt.
lxml's messages are terse, so ``agent.calls`` explains a failure in its own
words; a test checks that both verdicts always agree.
"""

from __future__ import annotations

import re
from functools import lru_cache

from lxml import etree

from tools.base import ParamType, ToolSpec

RNG_NS = "http://relaxng.org/ns/structure/1.0"
XSD_TYPES = "http://www.w3.org/2001/XMLSchema-datatypes"
_XML_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
XML_SPACE = " \t\n\r"  # what XSD's whitespace "collapse" removes around a value
TRUE_WORDS = ("true", "yes", "on", "1")
FALSE_WORDS = ("false", "no", "off", "0")


def boolean_spellings(words: tuple[str, ...]) -> frozenset[str]:
    """Accepted spellings: lower, Capitalised and UPPER case of each word."""
    return frozenset(v for w in words for v in (w, w.capitalize(), w.upper()))


def xml_safe(text: str) -> str:
    """Replace characters that XML 1.0 cannot carry (NUL, most C0 controls, lone surrogates,
    U+FFFE/U+FFFF) with U+FFFD. Both directions use it: calls built for validation here, and
    results serialised for the model in ``agent.calls``."""
    return _XML_INVALID.sub("\ufffd", text)


TRUE_VALUES = boolean_spellings(TRUE_WORDS)
FALSE_VALUES = boolean_spellings(FALSE_WORDS)


def _e(tag: str, parent: etree._Element | None = None, **attrs: str) -> etree._Element:
    el = etree.Element(f"{{{RNG_NS}}}{tag}", nsmap={None: RNG_NS}) if parent is None else etree.SubElement(
        parent, f"{{{RNG_NS}}}{tag}"
    )
    for k, v in attrs.items():
        el.set(k, v)
    return el


def grammar_element(spec: ToolSpec) -> etree._Element:
    """The RELAX NG grammar (as an element tree) accepting calls to ``spec``."""
    root = _e("element", name="tool_call", datatypeLibrary=XSD_TYPES)
    name_attr = _e("attribute", root, name="name")
    _e("value", name_attr, type="token").text = spec.name
    if not spec.params:
        _e("empty", root)
        return root
    group = _e("interleave", root)
    for p in spec.params:
        holder = group if p.required else _e("optional", group)
        param = _e("element", holder, name=p.name)
        if p.type is ParamType.INTEGER:
            _e("data", param, type="long")  # 64-bit, optional sign, surrounding space allowed
        elif p.type is ParamType.BOOLEAN:
            choice = _e("choice", param)
            for word in sorted(TRUE_VALUES | FALSE_VALUES):
                _e("value", choice, type="token").text = word
        else:
            _e("text", param)
    return root


@lru_cache(maxsize=256)
def grammar(spec: ToolSpec) -> etree.RelaxNG:
    return etree.RelaxNG(grammar_element(spec))


def call_element(name: str, params: tuple[tuple[str, str], ...]) -> etree._Element:
    """Build a call in canonical form: ``<tool_call name="t"><path>…</path></tool_call>``.

    Each parameter becomes an element named after it (RELAX NG cannot
    interleave several ``<param>`` elements told apart by an attribute). A
    name that is not an XML name becomes ``<_invalid_name/>``, which no grammar
    accepts. Characters XML cannot carry become U+FFFD, for validation only:
    the tool receives the original text.
    """
    el = etree.Element("tool_call")
    el.set("name", xml_safe(name))
    for key, value in params:
        tag = key if _XML_NAME.fullmatch(key) else "_invalid_name"
        etree.SubElement(el, tag).text = xml_safe(value)
    return el


def conforms(spec: ToolSpec, params: tuple[tuple[str, str], ...]) -> tuple[bool, str]:
    """Validate a call against its tool's grammar: (ok, lxml's message)."""
    rng = grammar(spec)
    ok = rng.validate(call_element(spec.name, params))
    return ok, "" if ok else str(rng.error_log.last_error)
