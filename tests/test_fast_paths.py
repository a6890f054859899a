"""The compiler's fast paths give exactly what the slow, reference paths give.

- `canonical_json` writes with the C `json` encoder where it can: its bytes
  must be `rfc8785.dumps`'s, and it must raise where that raises.
- `metaschema.plainly_valid` skips jsonschema's meta-schema check for common
  input schemas: it may only say True where jsonschema accepts the schema.
- `yamltext` makes plain scalars strings without the resolver where no
  implicit tag can apply: values must be PyYAML's (and where PyYAML's
  constructor fails, as on `0x_`, a located YAMLProblem, not a crash).
"""

from __future__ import annotations

import datetime
import math
import struct
from typing import Any

import pytest
import rfc8785
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from server.canonical import canonical_json, freeze, thaw
from server.compiler.metaschema import check_schema, plainly_valid
from server.compiler.yamltext import YAMLProblem, parse_yaml

SETTINGS = settings(max_examples=300, deadline=None)

# --- canonical JSON ------------------------------------------------------------

any_text = st.text(st.characters(), max_size=8)  # astral, private use and lone surrogates too
numbers = (
    st.integers(-(2**60), 2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.floats(min_value=-1e17, max_value=1e17)
    | st.integers(-(2**54), 2**54).map(float)
)
values = st.recursive(
    st.none() | st.booleans() | numbers | any_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=16,
)


def _reference(value: Any) -> bytes | str:
    try:
        return rfc8785.dumps(thaw(value))
    except (rfc8785.CanonicalizationError, UnicodeEncodeError) as exc:  # the latter: surrogate keys
        return type(exc).__name__


def _ours(value: Any) -> bytes | str:
    try:
        return canonical_json(value)
    except (rfc8785.CanonicalizationError, UnicodeEncodeError) as exc:
        return type(exc).__name__


@SETTINGS
@given(values)
def test_canonical_json_is_rfc8785(value: Any) -> None:
    assert _ours(value) == _reference(value)
    assert _ours(freeze(value)) == _reference(value)


@settings(max_examples=2000, deadline=None)
@given(st.floats(-1, 1, exclude_min=True, exclude_max=True), st.integers(-1080, 1024),
       st.integers(0, 2**64 - 1))
def test_every_double_is_spelled_as_rfc8785(mantissa: float, exponent: int, bits: int) -> None:
    scaled = math.ldexp(mantissa, exponent)  # every order of magnitude alike
    arbitrary = struct.unpack("<d", bits.to_bytes(8, "little"))[0]
    for number in (scaled, arbitrary):
        assert _ours([number]) == _reference([number])


@pytest.mark.parametrize("value", [
    0.0, -0.0, 1e-4, 9.999999999999999e-05, 1e16, 9999999999999998.0, 2.0**53, -(2.0**53),
    2**53 - 1, 2**53, -(2**53), 5e-324, 1.7976931348623157e308, math.inf, math.nan,
    {"\ue000": 1, "\U0001f600": 2, "a": 3}, "\ud800", {1: 2}, {"a": {1, 2}}, b"x",
    "\x00\x1f\x7f\u2028\"\\/\b\f\n\r\t",
])
def test_canonical_json_edges(value: Any) -> None:
    assert _ours(value) == _reference(value)


# --- the meta-schema fast path --------------------------------------------------

keywords = st.sampled_from([
    "type", "enum", "const", "default", "examples", "title", "description", "format", "pattern",
    "multipleOf", "maximum", "minimum", "exclusiveMaximum", "exclusiveMinimum", "maxLength",
    "minLength", "maxItems", "minItems", "uniqueItems", "deprecated", "required", "properties",
    "items", "additionalProperties", "not", "allOf", "anyOf", "oneOf", "$ref", "$defs", "if",
    "patternProperties", "dependentRequired", "x-extra",
])
leaf_values = (
    st.sampled_from(["string", "object", "array", "integer", "number", "boolean", "null", "str"])
    | st.sampled_from(["^a+$", "(", "[a-z]", "\\d"])
    | st.none() | st.booleans() | st.integers(-3, 5) | st.floats(-3, 5, allow_nan=False)
    | st.text(max_size=3)
)
schemas = st.recursive(
    st.booleans() | st.dictionaries(keywords, leaf_values, max_size=3),
    lambda inner: (
        st.dictionaries(keywords, inner | leaf_values | st.lists(inner | leaf_values, max_size=3)
                        | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_size=4)
        | st.lists(inner, max_size=3)
    ),
    max_leaves=20,
)
META = Draft202012Validator(Draft202012Validator.META_SCHEMA,
                            format_checker=Draft202012Validator.FORMAT_CHECKER)


@settings(max_examples=1500, deadline=None)
@given(schemas)
def test_plainly_valid_only_when_valid(schema: Any) -> None:
    if plainly_valid(schema):
        assert META.is_valid(schema)


@SETTINGS
@given(schemas)
def test_check_schema_agrees_with_jsonschema(schema: Any) -> None:
    try:
        Draft202012Validator.check_schema(schema)
        expected = None
    except SchemaError as exc:
        expected = exc.message
    try:
        check_schema(schema)
        got = None
    except SchemaError as exc:
        got = exc.message
    assert got == expected


def test_common_schemas_take_the_fast_path() -> None:
    assert plainly_valid({
        "type": "object",
        "properties": {
            "q": {"type": "string", "description": "query", "minLength": 1, "pattern": "^[a-z]+$"},
            "n": {"type": ["integer", "null"], "minimum": 1, "maximum": 100, "default": 10},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True},
        },
        "required": ["q"],
        "additionalProperties": False,
    })
    assert not plainly_valid({"type": "object", "required": ["a", "a"]})
    assert not plainly_valid({"type": "object", "pattern": "("})
    assert not plainly_valid({"$ref": "#/$defs/x"})  # not in the subset: jsonschema decides


# --- YAML plain scalars -----------------------------------------------------------

scalar_text = st.text("tTfFnNyYoO~01.-+_:eE xa<=&*", min_size=0, max_size=8)  # no `!`: tags


def _json_like(value: Any) -> bool:
    return not isinstance(value, datetime.date | bytes) and not (
        isinstance(value, float) and not math.isfinite(value)
    )


@settings(max_examples=1000, deadline=None)
@given(scalar_text, st.sampled_from(["k: {}\n", "- {}\n", "k: [{}]\n", "{{a: {}}}\n"]))
def test_plain_scalars_resolve_as_pyyaml(text: str, template: str) -> None:
    source = template.format(text)
    try:  # libyaml's parser, as Corral's; PyYAML's resolver and constructor, as Corral's slow path
        expected = yaml.load(source, Loader=yaml.CSafeLoader)
    except yaml.YAMLError:
        return
    except ValueError:  # `0x_` resolves as an int that int() refuses: Corral says so
        with pytest.raises(YAMLProblem, match="not a valid"):
            parse_yaml(source)
        return
    if not all(_json_like(v) for v in _leaves(expected)):  # Corral keeps timestamps as text
        return
    if not _string_keys(expected):  # Corral keeps keys as their text
        return
    [doc] = parse_yaml(source)
    assert _typed(doc.data) == _typed(expected)


@settings(max_examples=500, deadline=None)
@given(scalar_text)
def test_keys_are_their_source_text(text: str) -> None:
    source = f"{text}: v\n"
    try:
        events = list(yaml.parse(source, Loader=yaml.CSafeLoader))
    except yaml.YAMLError:
        return
    kinds = [type(e).__name__ for e in events]
    if kinds[2:6] != ["MappingStartEvent", "ScalarEvent", "ScalarEvent", "MappingEndEvent"]:
        return
    try:
        [doc] = parse_yaml(source)
    except YAMLProblem:  # `<<: v`: a merge key takes a mapping
        assert events[3].value == "<<"
        return
    assert list(doc.data) == [events[3].value]


def _string_keys(value: Any) -> bool:
    if isinstance(value, dict):
        return all(type(k) is str and _string_keys(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_string_keys(v) for v in value)
    return True


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


def _typed(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, value)


@pytest.mark.parametrize("text", ["0x_", "-0b_", "+0x_"])
def test_numbers_that_do_not_parse_are_located_problems(text: str) -> None:
    with pytest.raises(YAMLProblem, match="not a valid int") as caught:
        parse_yaml(f"kind: Model\nretries: {text}\n")
    assert (caught.value.position.line, caught.value.position.column) == (2, 10)
