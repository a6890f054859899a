"""The JSON Schema keywords that match regular expressions, with a matcher of our choosing.

`jsonschema` matches `pattern`, `patternProperties` (and so
`additionalProperties` and `unevaluatedProperties`, which ask which keys the
patterns cover) with Python's backtracking `re`. These are the same keywords,
word for word in what they report, given a `search(pattern, text)`; see
`schemas` for why. Each factory returns a keyword function for
`jsonschema.validators.extend`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from jsonschema.exceptions import ValidationError

Search = Callable[[str, str], bool]
Keyword = Callable[[Any, Any, Any, Any], Iterator[ValidationError]]


def pattern(search: Search) -> Keyword:
    def keyword(validator, patrn, instance, schema):
        if validator.is_type(instance, "string") and not search(patrn, instance):
            yield ValidationError(f"{instance!r} does not match {patrn!r}")
    return keyword


def pattern_properties(search: Search) -> Keyword:
    def keyword(validator, patterns, instance, schema):
        if not validator.is_type(instance, "object"):
            return
        for patrn, subschema in patterns.items():
            for k, v in instance.items():
                if search(patrn, k):
                    yield from validator.descend(v, subschema, path=k, schema_path=patrn)
    return keyword


def _extras(search: Search, instance: dict, schema: dict) -> list[str]:
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    return [k for k in instance if k not in properties and not any(search(p, k) for p in patterns)]


def _listed(keys: list[str], what: str = "unexpected") -> str:
    return f"{', '.join(map(repr, keys))} {'was' if len(keys) == 1 else 'were'} {what}"


def additional_properties(search: Search) -> Keyword:
    def keyword(validator, aP, instance, schema):
        if not validator.is_type(instance, "object"):
            return
        extras = _extras(search, instance, schema)
        if validator.is_type(aP, "object"):
            for extra in extras:
                yield from validator.descend(instance[extra], aP, path=extra)
        elif not aP and extras:
            if "patternProperties" in schema:
                verb = "does" if len(extras) == 1 else "do"
                joined = ", ".join(repr(each) for each in sorted(extras))
                patterns = ", ".join(repr(each) for each in sorted(schema["patternProperties"]))
                yield ValidationError(f"{joined} {verb} not match any of the regexes: {patterns}")
            else:
                yield ValidationError(f"Additional properties are not allowed ({_listed(sorted(extras))})")
    return keyword


def unevaluated_properties(search: Search) -> Keyword:
    def keyword(validator, uP, instance, schema):
        if not validator.is_type(instance, "object"):
            return
        evaluated = _evaluated(search, validator, instance, schema)
        unevaluated = [k for k in instance if k not in evaluated
                       and next(validator.descend(instance[k], uP, path=k, schema_path=k), None) is not None]
        if not unevaluated:
            return
        if uP is False:
            yield ValidationError(f"Unevaluated properties are not allowed ({_listed(sorted(unevaluated))})")
        else:
            yield ValidationError("Unevaluated properties are not valid under the given schema"
                                  f" ({_listed(unevaluated, 'unevaluated and invalid')})")
    return keyword


def _valid(validator, instance, schema) -> bool:
    return next(validator.descend(instance, schema), None) is None


def _evaluated(search: Search, validator, instance: dict, schema: Any) -> set[str]:
    """The keys of `instance` that `schema` evaluates (what jsonschema's
    `find_evaluated_property_keys_by_schema` finds, patterns matched by `search`)."""
    if not isinstance(schema, dict):
        return set()
    keys: set[str] = set()
    for ref_keyword in ("$ref", "$dynamicRef"):
        if (ref := schema.get(ref_keyword)) is not None:
            resolved = validator._resolver.lookup(ref)
            inner = validator.evolve(schema=resolved.contents, _resolver=resolved.resolver)
            keys |= _evaluated(search, inner, instance, resolved.contents)
    if validator.is_type(properties := schema.get("properties"), "object"):
        keys |= properties.keys() & instance.keys()
    for keyword in ("additionalProperties", "unevaluatedProperties"):
        if (sub := schema.get(keyword)) is not None:
            keys |= {k for k, v in instance.items() if _valid(validator, v, sub)}
    for patrn in schema.get("patternProperties", {}):
        keys |= {k for k in instance if search(patrn, k)}
    return keys | _evaluated_in_place(search, validator, instance, schema)


def _evaluated_in_place(search: Search, validator, instance: dict, schema: dict) -> set[str]:
    """The keys evaluated by the subschemas applied to `instance` itself."""
    keys: set[str] = set()
    for prop, sub in schema.get("dependentSchemas", {}).items():
        if prop in instance:
            keys |= _evaluated(search, validator, instance, sub)
    for keyword in ("allOf", "oneOf", "anyOf"):
        for sub in schema.get(keyword, []):
            if _valid(validator, instance, sub):
                keys |= _evaluated(search, validator, instance, sub)
    if "if" in schema:
        if _valid(validator, instance, schema["if"]):
            keys |= _evaluated(search, validator, instance, schema["if"])
            keys |= _evaluated(search, validator, instance, schema.get("then"))
        else:
            keys |= _evaluated(search, validator, instance, schema.get("else"))
    return keys
