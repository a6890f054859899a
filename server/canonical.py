"""Canonical JSON (RFC 8785), content digests, and deep-frozen JSON values.

A digest is `sha256:` + the hex SHA-256 of a value's RFC 8785 serialization,
so it depends on meaning only: key order, whitespace and number spelling
cannot change it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import rfc8785

PREFIX = "sha256:"
_SAFE_INT = 2**53 - 1  # RFC 8785 numbers are IEEE doubles
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False).encode


def canonical_json(value: Any) -> bytes:
    """RFC 8785 bytes of `value`.

    The `rfc8785` package is pure Python and slow; for the values definitions
    are made of, the C `json` encoder writes the very same bytes once floats
    are spelled as ECMAScript does (see `_plain`). Whatever `_plain` is unsure
    of goes to `rfc8785`, which also raises its own errors.
    """
    try:
        return _encode(_plain(value)).encode("utf-8")
    except (_NotPlain, UnicodeEncodeError):  # the latter: a lone surrogate
        return rfc8785.dumps(thaw(value))


class _NotPlain(Exception):
    pass


def _plain(value: Any) -> Any:
    """`value` as plain JSON data that `json` spells exactly as RFC 8785 does, or `_NotPlain`."""
    t = type(value)
    if t is str or t is bool or value is None:
        return value
    if t is int or t is float:
        return _plain_number(value)
    if t is dict or t is MappingProxyType:
        out = {}
        for k, v in value.items():
            # sort_keys orders by code point, RFC 8785 by UTF-16 unit: alike below U+D800
            if type(k) is not str or not (k.isascii() or max(k) < "\ud800"):
                raise _NotPlain
            out[k] = _plain(v)
        return out
    if t is list or t is tuple:
        return [_plain(v) for v in value]
    raise _NotPlain


def _plain_number(value: int | float) -> int | float:
    if type(value) is int:
        if -_SAFE_INT <= value <= _SAFE_INT:
            return value
    elif value.is_integer():
        if -_SAFE_INT <= value <= _SAFE_INT:
            return int(value)  # ECMAScript writes 60.0 as 60 and -0.0 as 0
    elif 1e-4 <= abs(value) < 1e16:
        return value  # where repr() and ECMAScript agree: no exponent, same shortest digits
    raise _NotPlain


def digest_of(value: Any) -> str:
    return PREFIX + hashlib.sha256(canonical_json(value)).hexdigest()


def digest_bytes(data: bytes) -> str:
    return PREFIX + hashlib.sha256(data).hexdigest()


def is_digest(text: str) -> bool:
    hexpart = text[len(PREFIX) :]
    return (
        text.startswith(PREFIX)
        and len(hexpart) == 64
        and all(c in "0123456789abcdef" for c in hexpart)
    )


def freeze(value: Any) -> Any:
    """A read-only deep copy: mappings become MappingProxyType, lists tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Plain dicts and lists again, for serializers."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(v) for v in value]
    return value
