"""JSON Schemas that never reach out and never stall: the one way to check one and to build a validator.

A schema comes from a definition (`output_schema`, `input_schema`), an API
client (the OpenAI route's `response_format`) or an MCP server's catalog.
`jsonschema` left to itself fetches any `$ref` it cannot resolve (http URLs
and `file:` paths alike, on the caller's thread) and matches `pattern` with
Python's backtracking `re`, which holds the GIL for the whole match: one
pattern such as `^(a+)+$` freezes every thread for seconds, so moving the
validation to a worker thread bounds nothing.

So `check_schema` (the meta-schema, then our two rules) refuses, with the
JSON path of the node:
- a `$ref` / `$dynamicRef` that does not resolve inside the schema itself
  (local pointers, `$defs`, anchors and `$id`-relative references to its own
  resources do);
- a `pattern` or `patternProperties` key that a regex engine without
  backtracking cannot run (lookaround, backreferences: the features that
  need backtracking).
`validator` builds a validator whose registry retrieves nothing and whose
pattern keywords match with the Rust `regex` engine that pydantic-core
carries (linear in the text), so validation is bounded whatever the input.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from functools import lru_cache
from typing import TYPE_CHECKING, Annotated, Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, ValidationError
from pydantic import ConfigDict, StringConstraints, TypeAdapter
from pydantic import ValidationError as PydanticError
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable
from referencing.jsonschema import DRAFT202012

from . import pattern_keywords
from .metaschema import check_schema as check_meta

if TYPE_CHECKING:
    from referencing._core import Resolver

# The 2020-12 keywords whose values are subschemas: one, a list of them, or a map of them.
_ONE = ("additionalProperties", "contains", "contentSchema", "else", "if", "items", "not",
        "propertyNames", "then", "unevaluatedItems", "unevaluatedProperties")
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")
_MAP = ("$defs", "definitions", "dependentSchemas", "patternProperties", "properties")
Path = tuple[str | int, ...]


def _refuse(uri: str) -> Any:
    raise NoSuchResource(ref=uri)  # nothing outside the schema is ever fetched


# Retrieves nothing: a reference outside the schema fails to resolve instead of being fetched.
LOCAL = Registry(retrieve=_refuse)  # type: ignore[call-arg]


@lru_cache(maxsize=1024)
def _matcher(pattern: str) -> TypeAdapter[str]:
    """A linear-time matcher of `pattern` (search semantics, as JSON Schema's); raises on a
    pattern that engine cannot run."""
    constrained = Annotated[str, StringConstraints(pattern=pattern)]
    return TypeAdapter(constrained, config=ConfigDict(regex_engine="rust-regex"))


def refusal(pattern: str) -> str | None:
    """Why the linear-time engine cannot run `pattern` (the last line of its own words), or None."""
    try:
        _matcher(pattern)
    except Exception as exc:  # pydantic-core's SchemaError, worded by the regex engine
        return str(exc).strip().splitlines()[-1]
    return None


def search(pattern: str, text: str) -> bool:
    """Whether `pattern` matches somewhere in `text`, in time linear in `text`."""
    try:
        _matcher(pattern).validate_python(text)
    except PydanticError:
        return False
    return True


def schema_field(schema: Any) -> Any:
    """`check_schema` for a definition's field: a `ValueError` naming where the schema is wrong (the
    compiler reports it at the field's file:line:col); the schema itself when it is right."""
    try:
        check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "(root)"
        raise ValueError(f"not a valid JSON Schema at {where}: {exc.message}") from None
    return schema


def check_schema(schema: Any) -> None:
    """Raise `SchemaError` (with the offending node's path) unless `schema` is a valid 2020-12
    schema that resolves every reference inside itself and whose patterns run in bounded time."""
    check_meta(schema)
    if not isinstance(schema, dict):
        return
    referring = False
    for path, node, _ in _subschemas(schema, (), None):
        _check_patterns(path, node)
        referring = referring or "$ref" in node or "$dynamicRef" in node
    if referring:  # resolvers cost: only for a schema with references (walked again, with its `$id`s)
        root = LOCAL.resolver_with_root(DRAFT202012.create_resource(schema))
        for path, node, resolver in _subschemas(schema, (), root):
            _check_refs(path, node, resolver)


def _subschemas(node: Any, path: Path,
                resolver: Resolver | None) -> Iterator[tuple[Path, dict, Resolver | None]]:
    """Every subschema with its path and, given a root resolver, the resolver of its base URI
    (`$id`s taken into account)."""
    if not isinstance(node, dict):
        return
    if resolver is not None:
        resolver = resolver.in_subresource(DRAFT202012.create_resource(node))
    yield path, node, resolver
    for key in _ONE:
        if key in node:
            yield from _subschemas(node[key], (*path, key), resolver)
    for key in _LIST:
        for i, sub in enumerate(node.get(key) or ()):
            yield from _subschemas(sub, (*path, key, i), resolver)
    for key in _MAP:
        subs = node.get(key)
        for name, sub in (subs.items() if isinstance(subs, dict) else ()):
            yield from _subschemas(sub, (*path, key, name), resolver)


def _check_refs(path: Path, node: dict, resolver: Resolver | None) -> None:
    assert resolver is not None
    for key in ("$ref", "$dynamicRef"):
        ref = node.get(key)
        if not isinstance(ref, str):
            continue
        try:
            resolver.lookup(ref)
        except Unresolvable:
            raise SchemaError(f"{key} {ref!r} does not resolve inside the schema (references to other"
                              " documents, URLs or files are not followed)",
                              path=deque((*path, key))) from None


def _check_patterns(path: Path, node: dict) -> None:
    patterns = [(("pattern",), node["pattern"])] if isinstance(node.get("pattern"), str) else []
    props = node.get("patternProperties")
    patterns += [(("patternProperties", p), p) for p in (props if isinstance(props, dict) else ())]
    for where, pattern in patterns:
        reason = refusal(pattern)
        if reason is not None:
            raise SchemaError(f"pattern {pattern!r} cannot be matched in bounded time (no lookaround or"
                              f" backreferences): {reason.strip()}", path=deque((*path, *where)))


Validator = validators.extend(Draft202012Validator, {
    "pattern": pattern_keywords.pattern(search),
    "patternProperties": pattern_keywords.pattern_properties(search),
    "additionalProperties": pattern_keywords.additional_properties(search),
    "unevaluatedProperties": pattern_keywords.unevaluated_properties(search),
})


def validator(schema: Any) -> Draft202012Validator:
    """A validator of `schema` that fetches nothing and matches patterns in linear time."""
    return Validator(schema, registry=LOCAL)


def problems(validator: Draft202012Validator, instance: Any) -> list[ValidationError]:
    """The validation errors of `instance`, sorted by path; a schema that cannot be applied (a
    reference outside itself, from a catalog nobody checked; a `$ref` loop) is one error saying so."""
    try:
        return sorted(validator.iter_errors(instance), key=lambda e: list(e.path))
    except Unresolvable as exc:
        return [ValidationError(f"the schema cannot be applied: {exc}")]
    except RecursionError:
        return [ValidationError("the schema cannot be applied: its references loop without end")]
