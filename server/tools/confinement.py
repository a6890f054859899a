"""The secret boundary around the programs Corral starts (§7).

Two halves. What goes in: a command tool or hook gets a minimal environment
(`PATH`, `HOME`, `LANG`, `TZ`, `TMPDIR`) plus what its own definition names,
never the server's whole environment and never a `CORRAL_*` setting; the one
`CORRAL_*` variable it may get is `CORRAL_EXECUTION_KEY`, the key of the tool
call it runs for (or guards), which is no secret and no setting. What
comes out: the value of every secret the definition set references, and
every API key, is cut from whatever a tool or hook returns before it is
stored, streamed or sent to a model (`Redactor`).

`Secrets` learns the `${VAR}` names of every definition set the server has
served (a pinned turn may run an old one) and keeps one `Redactor` over their
current values, the server's API keys and any variable whose name says it
holds a key. It is not responsible for resolving `${VAR}` (`templates`) or for
which programs run (`processes`).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..compiler.templates import SECRET_REF
from ..tracing import trace_environment
from .base import EXECUTION_KEY_ENV

INHERITED = ("PATH", "HOME", "LANG", "TZ", "TMPDIR")
REDACTED = "[redacted]"
MIN_SECRET_LEN = 4  # a referenced value shorter than this would redact ordinary text
MIN_GUESSED_LEN = 8  # values taken for their variable's name alone must look like keys
# Variables whose names say they hold a credential, whether or not a definition references them.
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


def child_environment(extra: Mapping[str, str] | None = None,
                      environ: Mapping[str, str] | None = None, *, execution_key: str = "") -> dict[str, str]:
    """The environment of a command tool or hook: the minimal inherited set plus `extra`, and
    `CORRAL_EXECUTION_KEY` when a tool call's key is given (`tools.base.execution_key`)."""
    source = os.environ if environ is None else environ
    env = {name: source[name] for name in INHERITED if name in source}
    env["PATH"] = program_path(source.get("PATH"))
    env.update(extra or {})
    if execution_key:
        env[EXECUTION_KEY_ENV] = execution_key
    env.update(trace_environment())  # TRACEPARENT: the span it runs in (a tool call's, a hook's)
    return env


def program_path(path: str | None) -> str:
    """A child's PATH: when Corral runs in a virtualenv, its `bin` first, so that `python3` in a
    definition is the interpreter Corral runs on, with its packages, whether or not the virtualenv
    was activated (`make serve` does not activate it)."""
    entries = [p for p in (path or os.defpath).split(os.pathsep) if p]
    if sys.prefix != sys.base_prefix:
        own = str(Path(sys.executable).parent)
        entries = [own, *(p for p in entries if p != own)]
    return os.pathsep.join(entries)


class Redactor:
    """Replaces every known secret value in text (and in the strings of a JSON value) with a marker."""

    def __init__(self, values: Iterable[str] = ()):
        kept = sorted({v for v in values if len(v) >= MIN_SECRET_LEN}, key=len, reverse=True)
        # one pass, longest first: a secret that contains another is cut whole
        self._pattern = re.compile("|".join(map(re.escape, kept))) if kept else None

    def __bool__(self) -> bool:
        return self._pattern is not None

    def text(self, text: str) -> str:
        if self._pattern is None or not text:
            return text
        return self._pattern.sub(REDACTED, text)

    def value(self, value: Any) -> Any:
        """`value` with every string in it redacted (dict keys included), same shape."""
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {self.text(str(k)): self.value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(v) for v in value]
        return value


NO_REDACTION = Redactor()


class Secrets:
    """Every secret value a tool or hook must never hand back, kept current across swaps."""

    def __init__(self, environ: Mapping[str, str], api_keys: Iterable[str] = ()):
        self.environ = environ
        self.api_keys = tuple(api_keys)
        self.names: set[str] = set()
        self.redactor = self._build()

    def learn(self, specs: Iterable[Any]) -> None:
        """Take note of the `${VAR}` names referenced anywhere in these specs."""
        found = set()
        for spec in specs:
            found.update(_references(spec))
        if not found <= self.names:
            self.names |= found
            self.redactor = self._build()

    def _build(self) -> Redactor:
        values = [self.environ[n] for n in self.names if n in self.environ]
        guessed = [v for n, v in self.environ.items() if _SECRET_NAME.search(n) and len(v) >= MIN_GUESSED_LEN]
        return Redactor([*values, *guessed, *self.api_keys, *_api_keys(self.environ)])


def _api_keys(environ: Mapping[str, str]) -> list[str]:
    return [k.strip() for k in environ.get("CORRAL_API_KEYS", "").split(",") if k.strip()]


def _references(value: Any) -> set[str]:
    if isinstance(value, str):
        return {m.group(1) for m in SECRET_REF.finditer(value)} if "${" in value else set()
    if isinstance(value, Mapping):
        return set().union(*(_references(v) for v in value.values())) if value else set()
    if isinstance(value, list | tuple):
        return set().union(*(_references(v) for v in value)) if value else set()
    return set()
