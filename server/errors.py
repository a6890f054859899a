"""Every error Corral raises on purpose, in three families.

    CorralError                      code, message, details; maps to HTTP and MCP
    ├── AuthorError                  the YAML author's mistake, found at compile time
    │   └── DefinitionsInvalid       a whole set failed: carries every DefinitionError
    ├── RequestError                 the client's mistake (4xx)
    │   ├── InvalidRequest, NotFound, ConversationBusy, Unauthorized, ...
    └── RunError                     something failed while a turn ran
        ├── ModelError, ToolError, StorageError, Interrupted

`DefinitionError` is not an exception: compilation collects all of them and
raises (or returns) them together, because an author wants every mistake in
one pass, not the first one.

The same envelope, `{"error": {"code", "message", "details"?}}`, appears in
HTTP responses and in `turn.failed` events; `HTTP_STATUS` is the one table
from code to status.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HTTP_STATUS: dict[str, int] = {
    "invalid_request": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "agent_not_found": 404,
    "digest_not_found": 404,
    "conversation_not_found": 404,
    "not_found": 404,
    "conversation_busy": 409,
    "conflict": 409,
    "method_not_allowed": 405,
    "request_timeout": 408,
    "payload_too_large": 413,
    "unsupported_media_type": 415,
    "host_not_allowed": 421,
    "idempotency_key_reused": 422,
    "definitions_invalid": 422,
    "lock_mismatch": 409,
    "model_error": 502,
    "tool_error": 502,
    "overloaded": 503,
    "storage_error": 503,
    "interrupted": 500,
    "internal": 500,
}


class CorralError(Exception):
    """Base of every intentional error; `code` is stable and public."""

    code = "internal"

    def __init__(self, message: str, *, code: str | None = None, details: Any = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details = details

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)

    def envelope(self, request_id: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details is not None:
            body["details"] = self.details
        if request_id:
            body["request_id"] = request_id
        return {"error": body}


class AuthorError(CorralError):
    """A mistake in the definition files."""


class RequestError(CorralError):
    """A client sent something we cannot act on."""

    code = "invalid_request"


class RunError(CorralError):
    """A turn failed while running."""


class ModelError(RunError):
    code = "model_error"


class ToolError(RunError):
    code = "tool_error"


class StorageError(RunError):
    """The store could not commit (or read) what a turn needed; the message names no path."""

    code = "storage_error"


@dataclass(frozen=True, kw_only=True, order=True)
class DefinitionError:
    """One author mistake, located as precisely as the source allows."""

    file: str
    line: int = 1
    column: int = 1
    kind: str = ""
    name: str = ""
    field: str = ""
    message: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}"
        what = f"{self.kind}/{self.name}" if self.kind else "document"
        path = self.field or "(document)"
        return f"{where}: {what}: {path}: {self.message}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "kind": self.kind,
            "name": self.name,
            "field": self.field,
            "message": self.message,
        }


class DefinitionsInvalid(AuthorError):
    """A definition set did not compile; `errors` holds every mistake found."""

    code = "definitions_invalid"

    def __init__(self, errors: list[DefinitionError] | tuple[DefinitionError, ...]):
        self.errors = tuple(sorted(errors))
        count = len(self.errors)
        super().__init__(
            f"{count} error{'s' if count != 1 else ''} in definitions",
            details=[e.as_dict() for e in self.errors],
        )
