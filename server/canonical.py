"""Canonical JSON (RFC 8785), content digests, and deep-frozen JSON values.

A digest is `sha256:` + the hex SHA-256 of a value's RFC 8785 serialization,
so it depends on meaning only: key order, whitespace and number spelling
cannot change it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import rfc8785

PREFIX = "sha256:"


def canonical_json(value: Any) -> bytes:
    return rfc8785.dumps(thaw(value))


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
