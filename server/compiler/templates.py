"""`{param}` placeholders and `${VAR}` secret references.

A template is text with `{name}` placeholders filled from a tool input's
top-level fields; `{{` and `}}` are literal braces. A secret reference is
`${VAR}` or `${VAR:-default}`, resolved from the environment only when it is
used, never when a definition is compiled or hashed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any

_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_PARAM = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SECRET_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class TemplateSyntaxError(ValueError):
    pass


class MissingValue(KeyError):
    """A placeholder had no value in the tool input."""


def placeholders(template: str) -> tuple[str, ...]:
    """The placeholder names in `template`, in order; raises TemplateSyntaxError."""
    names: list[str] = []
    for match in _TOKEN.finditer(_without_secrets(template)):
        token = match.group(0)
        if token in ("{{", "}}"):
            continue
        name = match.group(1)
        if name is None:
            raise TemplateSyntaxError(f"unbalanced {token!r} (write {token * 2} for a literal)")
        if not _PARAM.match(name):
            raise TemplateSyntaxError(f"bad placeholder {{{name}}}: use {{field_name}}")
        names.append(name)
    return tuple(names)


def _without_secrets(template: str) -> str:
    # `${VAR}` is a secret reference, not a placeholder: blank it out before scanning.
    return SECRET_REF.sub(lambda m: "$" + "_" * (len(m.group(0)) - 1), template)


_PIECE = re.compile(SECRET_REF.pattern + r"|" + _TOKEN.pattern)  # a secret reference, or a template token


def render(template: str, values: Mapping[str, Any], encode: Callable[[str], str] = str) -> str:
    """Fill placeholders from `values`, each passed through `encode`; secrets stay as written.

    One pass over the template: a value is never scanned again, so whatever it holds (braces,
    `${X}`, a NUL byte) is kept exactly as given.
    """

    def fill(match: re.Match[str]) -> str:
        token = match.group(0)
        if match.group(1) is not None:  # ${VAR}: resolved at use time, not here
            return token
        if token == "{{":
            return "{"
        if token == "}}":
            return "}"
        name = match.group(3)
        if name is None or name not in values or values[name] is None:
            raise MissingValue(name or token)
        value = values[name]
        text = value if isinstance(value, str) else _json_text(value)
        return encode(text)

    return _PIECE.sub(fill, template)


def _json_text(value: Any) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def is_secret_reference(text: str) -> bool:
    """True when `text` holds nothing but `${VAR}` references."""
    return bool(text) and SECRET_REF.sub("", text) == ""


class MissingSecret(KeyError):
    """A `${VAR}` without default named an unset variable."""


def resolve_secrets(text: str, environ: Mapping[str, str] | None = None) -> str:
    """Replace `${VAR}` / `${VAR:-default}` with their values, at use time only."""
    env = os.environ if environ is None else environ

    def value(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise MissingSecret(name)

    return SECRET_REF.sub(value, text)
