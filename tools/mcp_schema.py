"""Tool schemas both ways between the runtime's :class:`tools.base.ToolSpec` and MCP's JSON Schema.

* :func:`input_schema` — a ``ToolSpec`` as the ``inputSchema`` of an MCP tool
  (``flywheel mcp`` lists the built-in tools with it): one property per
  parameter, ``required`` as the spec says, no other properties. ``text``
  parameters (byte-exact) carry ``"contentMediaType": "text/plain"``, so a
  client that reads this module's other direction keeps them byte-exact.
* :func:`spec_from_mcp` — an external MCP tool as a ``ToolSpec`` the prompt,
  the validator and the executor use like any built-in one, plus the map from
  the parameter names the model writes back to the names the server expects.

Type mapping (JSON Schema -> :class:`tools.base.ParamType`): ``string`` ->
``string`` (surrounding whitespace stripped), or ``text`` with a
``contentMediaType``; ``integer``, ``boolean``, ``number`` -> the same;
anything else (objects, arrays, unions, ``$ref``, no type) -> ``json``. A
nullable type (``["string", "null"]``) maps to the non-null type. Each
property's own schema (with the root's ``$defs``) goes into
``ParamSpec.schema`` when it says more than its type, so ``agent.calls``
checks enums, ranges and object shapes before the call is sent.

Not guaranteed: keywords that relate several properties (``oneOf`` at the
root, ``dependentRequired``) are not part of any one parameter; the MCP tool
checks the whole argument object against the server's schema before sending
(:mod:`tools.mcp_client`). Property names that are not XML names are renamed
(``my key`` -> ``my_key``) for the XML call format.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tools.base import ParamSpec, ParamType, ToolSpec

MAX_DESCRIPTION_CHARS = 4000
"""An external tool's description is cut here before it reaches the system prompt."""
MAX_PARAM_DESCRIPTION_CHARS = 600
MAX_SCHEMA_HINT_CHARS = 300
MAX_PARAMS = 64
_XML_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f]")
_PLAIN_KEYS = frozenset({"type", "description", "title", "default", "contentMediaType", "examples"})
_TYPES = {"string": ParamType.STRING, "integer": ParamType.INTEGER, "boolean": ParamType.BOOLEAN,
          "number": ParamType.NUMBER}


class SchemaError(ValueError):
    """An external tool's schema that cannot become a ToolSpec; the message says why."""


def input_schema(spec: ToolSpec) -> dict[str, Any]:
    """``spec``'s parameters as a JSON Schema object (an MCP tool's ``inputSchema``)."""
    properties: dict[str, Any] = {}
    for p in spec.params:
        prop: dict[str, Any] = json.loads(p.schema) if p.schema else {}
        if p.type is ParamType.TEXT:
            prop |= {"type": "string", "contentMediaType": "text/plain"}
        elif p.type is not ParamType.JSON:
            prop["type"] = p.type.value
        prop["description"] = p.description
        if p.default is not None:
            prop["default"] = p.default
        properties[p.name] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    required = [p.name for p in spec.params if p.required]
    if required:
        schema["required"] = required
    return schema


@dataclass(frozen=True, slots=True)
class ExternalSpec:
    """An external tool as the runtime sees it: ``spec`` (named ``spec.name`` in
    prompts and calls) and ``aliases`` (parameter name in calls -> name on the server)."""

    spec: ToolSpec
    aliases: Mapping[str, str]


def tool_name(server: str, tool: str) -> str:
    """The name a session knows an external tool by: ``mcp__SERVER__TOOL`` (characters
    other than letters, digits, ``_`` and ``-`` become ``_``)."""
    return f"mcp__{_NAME_CHARS.sub('_', server)}__{_NAME_CHARS.sub('_', tool)}"


def clean_text(text: object, limit: int) -> str:
    """Untrusted text for the prompt: a string, control characters (but newlines and
    tabs) removed, at most ``limit`` characters (with a note when cut)."""
    s = _CONTROL.sub("", text if isinstance(text, str) else "")
    return s if len(s) <= limit else s[:limit] + " [… cut]"


def spec_from_mcp(name: str, description: object, schema: object) -> ExternalSpec:
    """An external tool named ``name`` (already :func:`tool_name`) with MCP's
    ``description`` and ``inputSchema``; :class:`SchemaError` for a schema that is not
    a JSON Schema object or has more than :data:`MAX_PARAMS` properties."""
    if not isinstance(schema, Mapping) or schema.get("type", "object") != "object":
        raise SchemaError("its inputSchema is not a JSON Schema of type object")
    _check_schema(schema)
    properties = schema.get("properties") or {}
    if not isinstance(properties, Mapping):
        raise SchemaError("its inputSchema's properties are not an object")
    if len(properties) > MAX_PARAMS:
        raise SchemaError(f"it has {len(properties)} parameters (at most {MAX_PARAMS})")
    required_raw = schema.get("required") or []
    required = set(required_raw) if isinstance(required_raw, list) else set()
    defs = {k: schema[k] for k in ("$defs", "definitions") if isinstance(schema.get(k), Mapping)}
    params: list[ParamSpec] = []
    aliases: dict[str, str] = {}
    for real, prop in properties.items():
        if not isinstance(real, str) or not isinstance(prop, Mapping | bool):
            raise SchemaError(f"its property {real!r} is not a schema")
        alias = _alias(real, aliases)
        aliases[alias] = real
        params.append(_param(alias, prop if isinstance(prop, Mapping) else {}, real in required, defs))
    text = clean_text(description, MAX_DESCRIPTION_CHARS).strip() or "(no description given by the server)"
    return ExternalSpec(ToolSpec(name, text, tuple(params)), aliases)


def _check_schema(schema: Mapping[str, Any]) -> None:
    from jsonschema import exceptions, validators

    try:
        validators.validator_for(schema).check_schema(schema)
    except exceptions.SchemaError as exc:
        raise SchemaError(f"its inputSchema is not a valid JSON Schema: {exc.message[:200]}") from None


def _alias(real: str, taken: Mapping[str, str]) -> str:
    alias = real if _XML_NAME.fullmatch(real) else _NAME_CHARS.sub("_", real) or "_"
    if not _XML_NAME.fullmatch(alias):
        alias = "_" + alias
    base, n = alias, 2
    while alias in taken:
        alias, n = f"{base}_{n}", n + 1
    return alias


def _param(alias: str, prop: Mapping[str, Any], required: bool, defs: Mapping[str, Any]) -> ParamSpec:
    kind = _kind(prop)
    described = clean_text(prop.get("description") or prop.get("title") or "", MAX_PARAM_DESCRIPTION_CHARS).strip()
    constraints = {k: v for k, v in prop.items() if k not in _PLAIN_KEYS}
    checked: str | None = None
    if constraints or kind is ParamType.JSON or isinstance(prop.get("type"), list):
        full = {**prop, **defs}
        checked = json.dumps(full, sort_keys=True, separators=(",", ":"))
        hint = json.dumps({k: v for k, v in full.items() if k not in ("description", "title", "$defs",
                                                                    "definitions")},
                          separators=(",", ":"), sort_keys=True)
        if len(hint) > MAX_SCHEMA_HINT_CHARS:
            hint = hint[:MAX_SCHEMA_HINT_CHARS] + "…"
        described = f"{described} Schema: {hint}".strip()
    default = prop.get("default")
    if not isinstance(default, str | int | float | bool):
        default = None if default is None else json.dumps(default)
    return ParamSpec(alias, kind, described or "(no description)", required, None if required else default,
                     checked)


def _kind(prop: Mapping[str, Any]) -> ParamType:
    t = prop.get("type")
    if isinstance(t, list):
        non_null = [x for x in t if x != "null"]
        t = non_null[0] if len(non_null) == 1 else None
    if t is None and isinstance(prop.get("enum"), list) and prop["enum"] \
            and all(isinstance(v, str) for v in prop["enum"]):
        t = "string"
    if any(k in prop for k in ("anyOf", "oneOf", "allOf", "$ref", "not")):
        return ParamType.JSON
    kind = _TYPES.get(t) if isinstance(t, str) else None
    if kind is ParamType.STRING and prop.get("contentMediaType"):
        return ParamType.TEXT
    return kind or ParamType.JSON
