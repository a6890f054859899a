"""Checking a tool's `input_schema` against the JSON Schema 2020-12 meta-schema, fast.

`jsonschema`'s `check_schema` costs milliseconds per schema (the 2020-12
meta-schema is seven vocabularies joined by `$dynamicRef`), which dominated
compiling a large definition set. Most input schemas use a small, common
subset of keywords whose meta-schema rules are simple; `plainly_valid`
recognizes those and says True only when the meta-schema surely accepts the
schema. Anything else (another keyword, an odd value) goes to `jsonschema`,
which also words every error, so the outcome is the same either way.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from jsonschema import Draft202012Validator

SIMPLE_TYPES = frozenset({"array", "boolean", "integer", "null", "number", "object", "string"})


def _number(v: Any) -> bool:
    return type(v) is int or type(v) is float  # bool is neither


def _non_negative_int(v: Any) -> bool:
    return type(v) is int and v >= 0


def _string(v: Any) -> bool:
    return type(v) is str


def _boolean(v: Any) -> bool:
    return type(v) is bool


def _array(v: Any) -> bool:
    return type(v) is list


def _anything(v: Any) -> bool:
    return True


def _string_array(v: Any) -> bool:
    return type(v) is list and all(type(s) is str for s in v) and len(set(v)) == len(v)


def _type(v: Any) -> bool:
    if type(v) is str:
        return v in SIMPLE_TYPES
    return _string_array(v) and bool(v) and all(t in SIMPLE_TYPES for t in v)


def _regex(v: Any) -> bool:
    if type(v) is not str:
        return False
    try:
        re.compile(v)  # what jsonschema's "regex" format check does
    except re.error:
        return False
    return True


def _positive(v: Any) -> bool:
    return _number(v) and v > 0


def _schema_map(v: Any) -> bool:
    return type(v) is dict and all(plainly_valid(s) for s in v.values())


def _schema_array(v: Any) -> bool:
    return type(v) is list and bool(v) and all(plainly_valid(s) for s in v)


# keyword -> a check that implies the meta-schema's rule for that keyword
_CHECKS: dict[str, Callable[[Any], bool]] = {
    "type": _type,
    "enum": _array,
    "const": _anything,
    "default": _anything,
    "examples": _array,
    "title": _string,
    "description": _string,
    "format": _string,
    "$comment": _string,
    "pattern": _regex,
    "multipleOf": _positive,
    "maximum": _number,
    "minimum": _number,
    "exclusiveMaximum": _number,
    "exclusiveMinimum": _number,
    "maxLength": _non_negative_int,
    "minLength": _non_negative_int,
    "maxItems": _non_negative_int,
    "minItems": _non_negative_int,
    "maxProperties": _non_negative_int,
    "minProperties": _non_negative_int,
    "uniqueItems": _boolean,
    "deprecated": _boolean,
    "readOnly": _boolean,
    "writeOnly": _boolean,
    "required": _string_array,
    "properties": _schema_map,
    "items": lambda v: plainly_valid(v),
    "additionalProperties": lambda v: plainly_valid(v),
    "not": lambda v: plainly_valid(v),
    "allOf": _schema_array,
    "anyOf": _schema_array,
    "oneOf": _schema_array,
}


def plainly_valid(schema: Any) -> bool:
    """True only if the 2020-12 meta-schema accepts `schema`; False means "ask jsonschema"."""
    if type(schema) is bool:
        return True
    if type(schema) is not dict:
        return False
    for key, value in schema.items():
        check = _CHECKS.get(key)
        if check is None or not check(value):
            return False
    return True


def check_schema(schema: Any) -> None:
    """`Draft202012Validator.check_schema`, with a fast path: raises `SchemaError`."""
    if not plainly_valid(schema):
        Draft202012Validator.check_schema(schema)
