"""Validation against the tool schemas, and result serialisation."""

from __future__ import annotations

from lxml import etree

from agent.calls import CallRejected, ToolCall, render_results, validate_call
from agent.parser import MalformedCall, ParsedCall
from tools.base import ParamSpec, ParamType, ToolResult, ToolSpec

SPEC = ToolSpec(
    "read_file",
    "Read a file.",
    (
        ParamSpec("path", ParamType.STRING, "file path"),
        ParamSpec("start_line", ParamType.INTEGER, "first line", required=False),
        ParamSpec("numbers", ParamType.BOOLEAN, "show numbers", required=False),
        ParamSpec("note", ParamType.TEXT, "raw", required=False),
    ),
)
SPECS = {SPEC.name: SPEC}


def check(*params: tuple[str, str], name: str = "read_file") -> ToolCall | CallRejected:
    return validate_call(ParsedCall(0, name, params), SPECS, "c0")


def test_valid_call_is_typed() -> None:
    call = check(("path", "  a.py\n"), ("start_line", " 12 "), ("numbers", "false"), ("note", "  x \n"))
    assert isinstance(call, ToolCall)
    assert call.args == {"path": "a.py", "start_line": 12, "numbers": False, "note": "  x \n"}


def test_unknown_tool_lists_available() -> None:
    r = check(("path", "a"), name="rm_rf")
    assert isinstance(r, CallRejected) and "unknown tool 'rm_rf'" in r.message and "read_file" in r.message


def test_missing_unknown_duplicate_and_wrong_type_are_all_named() -> None:
    r = check(("start_line", "ten"), ("bogus", "1"), ("numbers", "maybe"), ("numbers", "true"))
    assert isinstance(r, CallRejected)
    for fragment in [
        "missing required parameter(s): path",
        "unknown parameter 'bogus'",
        "given more than once",
        "'start_line' must be an integer",
        "'numbers' must be true or false",
        'expected form:\n<tool_call name="read_file">',
    ]:
        assert fragment in r.message


def test_malformed_call_becomes_rejection() -> None:
    r = validate_call(MalformedCall(3, None, "unclosed <tool_call>"), SPECS, "c3")
    assert isinstance(r, CallRejected) and r.index == 3 and "unclosed" in r.message


def test_results_serialise_in_order_and_survive_hostile_output() -> None:
    hostile = "a <b> & ]]> \x00\x1b[31m red \udcff"
    xml = render_results(
        [("read_file", 0, ToolResult(True, "<tag> & stuff")), ("grep", 1, ToolResult(False, hostile))]
    )
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)
    root = etree.fromstring(f"<r>{xml}</r>", parser)
    first, second = root
    assert first.get("status") == "ok" and first.text.strip() == "<tag> & stuff"
    assert second.get("status") == "error" and "]]>" in second.text and "\ufffd" in second.text


# -- the RELAX NG grammar and the validator agree -------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from agent.schema import conforms, grammar_element  # noqa: E402
from tools.registry import default_tools  # noqa: E402

_values = st.one_of(
    st.sampled_from(["1", " 42\n", "-7", "+3", "x", "", "1.5", "true", "False", "YES", "tRuE", "off", " 0 ",
                     "99999999999999999999", "\x00", "٣", "a.py", "<b>&"]),
    st.text(max_size=8),
)


@settings(max_examples=500)
@given(st.lists(st.tuples(st.sampled_from(["path", "start_line", "numbers", "note", "other"]), _values),
                max_size=5))
def test_property_grammar_and_validator_agree(params) -> None:
    verdict = check(*params)
    ok, _ = conforms(SPEC, tuple(params))
    assert isinstance(verdict, ToolCall) == ok, (params, verdict)


def test_grammars_compile_for_every_builtin_tool() -> None:
    for tool in default_tools():
        assert grammar_element(tool.spec).get("name") == "tool_call"
        ok, message = conforms(tool.spec, ())
        assert ok == (not any(p.required for p in tool.spec.params)), message


def test_schema_does_not_depend_on_calls() -> None:
    """The dependency is one-way (calls -> schema): building a call for validation, control
    characters included, never imports agent.calls (it used to, from inside call_element)."""
    import subprocess
    import sys

    code = ("import sys\nfrom agent.schema import call_element\n"
            "el = call_element('t\\x00', (('p', 'a\\x01b'),))\n"
            "assert el.get('name') == 't\\ufffd' and el[0].text == 'a\\ufffdb', (el.get('name'), el[0].text)\n"
            "assert 'agent.calls' not in sys.modules, 'agent.schema imported agent.calls'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
