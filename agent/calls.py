"""Validate parsed calls against the tool schemas; serialise results for the model.

The validator reads the same :class:`tools.base.ToolSpec` objects that
``agent.prompt`` turns into tool descriptions, so what the model is told and
what is accepted cannot drift apart. Each call is also built as an lxml
element and checked against a RELAX NG grammar generated from its spec
(``agent.schema``); a call is accepted only if both agree. Every failure becomes a
:class:`CallRejected` whose message names what was wrong and shows the
expected form; nothing here raises on model input.

Results are serialised with lxml, which escapes or wraps in CDATA whatever
the tool printed; characters XML cannot carry (NUL, most C0 controls,
lone surrogates) are replaced by ``\\uFFFD`` rather than dropped silently.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from lxml import etree

from agent.parser import MalformedCall, ParsedCall, encode_call
from agent.schema import FALSE_VALUES, TRUE_VALUES, XML_SPACE, conforms, xml_safe
from tools.base import ParamSpec, ParamType, ToolResult, ToolSpec

_INT = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")  # JSON's number grammar
_LONG = range(-(2**63), 2**63)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A valid call, arguments typed per the schema (absent optionals omitted)."""

    index: int
    call_id: str
    name: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CallRejected:
    """A call that will not run; ``message`` goes back to the model."""

    index: int
    call_id: str
    name: str | None
    message: str


def example_call(spec: ToolSpec) -> str:
    """The expected form of a call to ``spec``, with placeholder values."""
    return encode_call(spec.name, [(p.name, f"<{p.type.value}>") for p in spec.params])


def _coerce(param: ParamSpec, raw: str) -> tuple[Any, str | None]:
    """``raw`` typed per ``param`` (then checked against its JSON Schema, if any), or an error."""
    value, error = _typed(param, raw)
    if error is None and param.schema is not None:
        error = _schema_error(param.name, param.schema, value)
    return value, error


def _typed(param: ParamSpec, raw: str) -> tuple[Any, str | None]:
    if param.type is ParamType.TEXT:
        return raw, None
    if param.type is ParamType.STRING:
        return raw.strip(), None
    if param.type is ParamType.JSON:
        try:
            return json.loads(raw, parse_constant=_no_constant), None
        except (ValueError, RecursionError) as exc:
            return None, f"parameter {param.name!r} must be JSON ({str(exc)[:120]}), got {raw.strip()[:40]!r}"
    value = raw.strip(XML_SPACE)
    if param.type is ParamType.NUMBER:
        if _NUMBER.fullmatch(value) and len(value) <= 400:
            number = float(value) if any(c in value for c in ".eE") else int(value)
            if math.isfinite(number):
                return number, None
        return None, f"parameter {param.name!r} must be a number, got {value[:40]!r}"
    if param.type is ParamType.INTEGER:
        if _INT.fullmatch(value) and len(value) <= 20 and int(value) in _LONG:
            return int(value), None
        return None, f"parameter {param.name!r} must be an integer, got {value[:40]!r}"
    if param.type is ParamType.BOOLEAN:
        if value in TRUE_VALUES:
            return True, None
        if value in FALSE_VALUES:
            return False, None
        return None, f"parameter {param.name!r} must be true or false, got {value[:40]!r}"
    raise AssertionError(param.type)  # pragma: no cover


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


@lru_cache(maxsize=1024)
def _validator(schema: str) -> Any:
    from jsonschema import validators  # imported here: only tools with schemas (external ones) need it

    parsed = json.loads(schema)
    cls = validators.validator_for(parsed)
    cls.check_schema(parsed)
    return cls(parsed, format_checker=cls.FORMAT_CHECKER)


def _schema_error(name: str, schema: str, value: Any) -> str | None:
    """The first way ``value`` breaks ``schema`` (a JSON Schema as text), in one line, or None."""
    from jsonschema import exceptions
    from referencing.exceptions import Unresolvable

    try:
        error = exceptions.best_match(_validator(schema).iter_errors(value))
    except (exceptions.SchemaError, Unresolvable, ValueError, RecursionError) as exc:  # an unusable schema fails closed
        return f"parameter {name!r} cannot be checked: its schema is invalid ({str(exc).splitlines()[0][:120]})"
    if error is None:
        return None
    where = "".join(f"[{p!r}]" for p in error.absolute_path)
    return f"parameter {name!r}{where}: {error.message[:300]}"


def validate_call(
    parsed: ParsedCall | MalformedCall, specs: Mapping[str, ToolSpec], call_id: str
) -> ToolCall | CallRejected:
    """Check one parsed call against the schemas."""
    if isinstance(parsed, MalformedCall):
        return CallRejected(parsed.index, call_id, parsed.name, f"malformed tool call: {parsed.message}")
    spec = specs.get(parsed.name)
    if spec is None:
        known = ", ".join(sorted(specs)) or "(none)"
        return CallRejected(
            parsed.index, call_id, parsed.name,
            f"unknown tool {parsed.name[:80]!r}; available tools: {known}",
        )
    problems: list[str] = []
    args: dict[str, Any] = {}
    seen: set[str] = set()
    for name, raw in parsed.params:
        param = spec.param(name)
        if param is None:
            allowed = ", ".join(p.name for p in spec.params) or "(none)"
            problems.append(f"unknown parameter {name[:80]!r} (allowed: {allowed})")
            continue
        if name in seen:
            problems.append(f"parameter {name!r} given more than once")
            continue
        seen.add(name)
        value, error = _coerce(param, raw)
        if error:
            problems.append(error)
        else:
            args[name] = value
    missing = [p.name for p in spec.params if p.required and p.name not in seen]
    if missing:
        problems.append("missing required parameter(s): " + ", ".join(missing))
    conform, lxml_message = conforms(spec, parsed.params)
    if not problems and not conform:  # fail closed if the grammar disagrees
        problems.append(f"does not match the schema: {lxml_message}")
    if problems:
        message = (
            f"invalid call to {spec.name}: " + "; ".join(problems)
            + f"\nexpected form:\n{example_call(spec)}"
        )
        return CallRejected(parsed.index, call_id, parsed.name, message)
    return ToolCall(parsed.index, call_id, spec.name, args)


def result_element(name: str | None, index: int, result: ToolResult) -> etree._Element:
    element = etree.Element("tool_result")
    element.set("name", xml_safe(name or "unknown"))
    element.set("index", str(index))
    element.set("status", "ok" if result.ok else "error")
    text = xml_safe(result.output)
    if text and "]]>" not in text and any(c in text for c in "<&"):
        element.text = etree.CDATA("\n" + text + "\n")
    else:
        element.text = "\n" + text + "\n" if text else ""
    return element


def render_results(results: list[tuple[str | None, int, ToolResult]]) -> str:
    """Serialise a step's results, in call order, as the model will read them."""
    return "\n".join(
        etree.tostring(result_element(name, index, r), encoding="unicode") for name, index, r in results
    )
