"""Untrusted text made inert for a terminal; JSON text escaped without changing its value."""

from __future__ import annotations

import json
import re

import pytest

from agent.text_safety import escape_json_text, inert, json_safe_text

# What a terminal acts on: C0 except \n \t, DEL, C1, bidi controls, and \r (bare or not)
ACTIVE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")

ATTACKS = {
    "osc0_title": ("before\x1b]0;pwned title\x07after", "before^[]0;pwned title^Gafter"),
    "osc0_st": ("x\x1b]0;t\x1b\\y", "x^[]0;t^[\\y"),
    "csi_clear": ("\x1b[2J\x1b[Hcleared", "^[[2J^[[Hcleared"),
    "osc52_clipboard": ("\x1b]52;c;ZWNobyBwd25lZA==\x07", "^[]52;c;ZWNobyBwd25lZA==^G"),
    "fake_prompt": ("real output\r$ fake prompt", "real output^M$ fake prompt"),
    "c1_csi": ("\x9b2J", "\\x9b2J"),
    "del": ("a\x7fb", "a^?b"),
    "bidi_override": ("access = \u202euser\u2066x\u2069", "access = \\u202euser\\u2066x\\u2069"),
    "nul_bel_vt": ("\x00\x07\x0b\x0c", "^@^G^K^L"),
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attacks_are_shown_not_acted_on(name: str) -> None:
    raw, shown = ATTACKS[name]
    out = inert(raw)
    assert out == shown
    assert ACTIVE.search(out) is None


def test_newlines_tabs_crlf_and_any_script_pass_unchanged() -> None:
    assert inert("a\tb\nc\r\nd") == "a\tb\nc\nd"
    text = "日本語 ünïcode emoji 😀 ₂ → ✓"
    assert inert(text) == text


def test_lone_surrogates_are_shown_not_raised_on_write() -> None:
    out = inert("x\udcffy")
    out.encode("utf-8")
    assert out == "x\\udcffy"


def test_json_escape_keeps_the_value_exact() -> None:
    value = {"t": "\x7f\x85\x9b\u202e\u2028\u2029 ok \x1b", "n": [1, "\u2066"]}
    raw = json.dumps(value, ensure_ascii=False)
    line = escape_json_text(raw)
    assert json.loads(line) == value
    assert ACTIVE.search(line) is None and "\u2028" not in line


@pytest.mark.parametrize("text", ["only ascii and DEL \x7f", "C1 only \x85", "bidi only \u2066", "ALM \u061c"])
def test_json_escape_finds_each_kind_alone(text: str) -> None:
    # each fast path (pure ASCII, no suspicious UTF-8 lead bytes) must still catch these
    line = escape_json_text(json.dumps(text, ensure_ascii=False))
    assert json.loads(line) == text and ACTIVE.search(line) is None


def test_json_safe_text_forms() -> None:
    assert json_safe_text("\udc80\udcff") == "\\x80\\xff"
    assert json_safe_text("\udc7f\udd00") == "\ufffd\ufffd"  # surrogates surrogateescape never produces
    assert json_safe_text("\ud83d") == "\ufffd"
