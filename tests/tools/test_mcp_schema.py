"""tools.mcp_schema: ToolSpec -> inputSchema for the server, MCP schemas -> ToolSpec for the
client, and the validator (agent.calls) enforcing what the schemas say."""

from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator

from agent.calls import CallRejected, ToolCall, validate_call
from agent.parser import ParsedCall
from tools.base import ParamType
from tools.mcp_schema import SchemaError, clean_text, input_schema, spec_from_mcp, tool_name
from tools.registry import default_tools


@pytest.mark.parametrize("tool", default_tools(semantic_search=True), ids=lambda t: t.spec.name)
def test_every_built_in_spec_becomes_a_valid_schema_and_back(tool) -> None:
    schema = input_schema(tool.spec)
    Draft202012Validator.check_schema(schema)
    assert schema.get("required", []) == [p.name for p in tool.spec.params if p.required]
    assert schema["additionalProperties"] is False
    back = spec_from_mcp(tool.spec.name, tool.spec.description, schema).spec
    assert [(p.name, p.type, p.required, p.default) for p in back.params] == \
        [(p.name, p.type, p.required, p.default) for p in tool.spec.params]  # text stays text (contentMediaType)
    assert back.description == tool.spec.description


def test_types_map_and_constraints_are_kept_for_the_validator() -> None:
    schema = {"type": "object", "required": ["mode", "n"], "properties": {
        "mode": {"type": "string", "enum": ["fast", "slow"], "description": "how"},
        "n": {"type": "integer", "minimum": 1, "maximum": 10},
        "ratio": {"type": "number"},
        "flag": {"type": "boolean", "default": False},
        "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
        "maybe": {"type": ["string", "null"]},
        "color": {"enum": ["red", "blue"]},
        "any": {},
    }, "$defs": {"Item": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}}}
    spec = spec_from_mcp("mcp__s__t", "Do it.", schema).spec
    kinds = {p.name: p.type for p in spec.params}
    assert kinds == {"mode": ParamType.STRING, "n": ParamType.INTEGER, "ratio": ParamType.NUMBER,
                     "flag": ParamType.BOOLEAN, "items": ParamType.JSON, "maybe": ParamType.STRING,
                     "color": ParamType.STRING, "any": ParamType.JSON}
    mode = spec.param("mode")
    assert mode is not None and mode.schema is not None and 'Schema: {"enum":["fast","slow"]' in mode.description
    assert spec.param("flag").default is False and spec.param("ratio").schema is None  # type: ignore[union-attr]

    def check(params: list[tuple[str, str]]) -> ToolCall | CallRejected:
        return validate_call(ParsedCall(0, "mcp__s__t", tuple(params)), {spec.name: spec}, "c")

    ok = check([("mode", "fast"), ("n", "3"), ("ratio", "2.5e1"), ("items", '[{"id": 1}]'), ("color", "red")])
    assert isinstance(ok, ToolCall) and ok.args == {"mode": "fast", "n": 3, "ratio": 25.0, "items": [{"id": 1}],
                                                    "color": "red"}
    for params, message in [
        ([("mode", "medium"), ("n", "3")], "parameter 'mode': 'medium' is not one of ['fast', 'slow']"),
        ([("mode", "fast"), ("n", "11")], "parameter 'n': 11 is greater than the maximum of 10"),
        ([("mode", "fast"), ("n", "1"), ("ratio", "NaN")], "parameter 'ratio' must be a number"),
        ([("mode", "fast"), ("n", "1"), ("ratio", "1e999")], "parameter 'ratio' must be a number"),
        ([("mode", "fast"), ("n", "1"), ("items", '[{"id": "x"}]')], "parameter 'items'[0]['id']: 'x' is not of"),
        ([("mode", "fast"), ("n", "1"), ("items", "[1,")], "parameter 'items' must be JSON"),
        ([("mode", "fast"), ("n", "1"), ("any", "NaN")], "parameter 'any' must be JSON"),
    ]:
        bad = check(params)
        assert isinstance(bad, CallRejected) and message in bad.message, (params, bad)


def test_names_and_descriptions_are_made_safe_for_the_prompt() -> None:
    assert tool_name("my server", "do.it/now") == "mcp__my_server__do_it_now"
    ext = spec_from_mcp("mcp__s__t", "Line one\x00\x1b[31m.\n" + "x" * 5000,
                        {"type": "object", "properties": {"a b": {"type": "string"}, "1st": {"type": "string"},
                                                          "a_b": {"type": "string"}}})
    assert ext.spec.description.startswith("Line one[31m.\n") and ext.spec.description.endswith("[… cut]")
    assert dict(ext.aliases) == {"a_b": "a b", "_1st": "1st", "a_b_2": "a_b"}
    assert clean_text(None, 10) == ""


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "array"}, "not a JSON Schema of type object"),
    ("nope", "not a JSON Schema of type object"),
    ({"type": "object", "properties": {"x": {"type": "nonsense"}}}, "not a valid JSON Schema"),
    ({"type": "object", "properties": {f"p{i}": {} for i in range(65)}}, "65 parameters (at most 64)"),
])
def test_unusable_schemas_are_refused(schema: object, message: str) -> None:
    with pytest.raises(SchemaError, match=message.replace("(", r"\(").replace(")", r"\)")):
        spec_from_mcp("mcp__s__t", "", schema)


def test_a_param_schema_is_canonical_json_so_specs_stay_hashable() -> None:
    spec = spec_from_mcp("mcp__s__t", "", {"type": "object", "properties": {"o": {"type": "object",
                                                                                 "properties": {"b": {}, "a": {}}}}}).spec
    assert hash(spec) and json.loads(spec.params[0].schema or "") == {"type": "object",
                                                                      "properties": {"a": {}, "b": {}}}
