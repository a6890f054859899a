"""Every error Corral shows, and the one table that says how each surface shows it.

    CorralError                      code, message, details; rendered from `ERRORS`
    ├── AuthorError                  the YAML author's mistake, found at compile time
    │   └── DefinitionsInvalid       a whole set failed: carries every DefinitionError
    ├── RequestError                 the client's mistake (4xx)
    │   ├── AgentNotFound            no agent by that name, or no alias by that name
    │   ├── DigestNotFound           the agent was never served with that digest
    │   ├── ConversationNotFound
    │   ├── TurnNotFound             no turn by that id in the conversation
    │   ├── ConversationBusy         a turn runs and `if_busy` is `reject`
    │   ├── IdempotencyKeyReused     the same key with another body
    │   ├── DuplicateIdempotencyKey  the store already has a turn with that key
    │   └── PermissionNotFound
    ├── StateOwned                   another live process owns the embedded store (its pid and URL)
    ├── Overloaded                   the server cannot take this now (at capacity, stopping): retry later
    │   └── TimedOut                 a bounded wait ran out (`runtime.bounds.waited`): retry later
    └── RunError                     something failed while a turn ran
        ├── ModelError
        │   └── ProviderError        a failed model call, `retryable` or not
        ├── ToolError
        ├── StorageError             the store could not commit or read
        │   └── StoreUnreachable     ... because it could not be reached: it may come back
        └── LeaseLost                another replica took the turn over: this one writes nothing more

Some codes are raised on a family's class, not on a class of their own
(`RunError(message, code="loop_detected")`): the code is what clients rely
on; a class of its own is for an error raised in several places or caught
by type. `DefinitionError` is not an exception:
compilation collects all of them and raises them together in
`DefinitionsInvalid`, because an author wants every mistake in one pass.

`ERRORS` maps every stable code to its three forms: the HTTP status of a
response carrying it, its MCP form (a tool result with `isError`, or a
JSON-RPC error), and the exit status of the `corral` command. One envelope,
`{"error": {"code", "message", "details"?}}`, built by `envelope`, is what
HTTP responses (the routes' and the guards'), MCP error results and
`turn.failed` events carry. `tests/test_errors.py` fails when a code used
anywhere under `server/` is not in the table.

Not in this module: control-flow signals that never reach a client as they
are. Each is caught where it crosses its boundary and translated there. A
program that cannot start (`tools.processes.StartFailed`), an MCP server
that cannot be reached (`tools.mcp.connection.ServerUnavailable`), a command
or request a tool cannot make (`CommandFailed`, `RequestFailed`), a file
that changed under a served digest (`deployment.vault.FileChanged`): a tool's
error output, or a hook's failure (`HookFailed`) and then its `on_error`
verdict. The compiler's `YAMLProblem`, `NormalizeError`, `PathEscape` and
the like: `DefinitionError`s. `LockError`: `lock_mismatch`.
`CatalogsUnavailable`: `corral lock`'s message and its `unreachable` exit
status. A queued turn's `Superseded`: the turn ends cancelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

TOOL_RESULT = "tool_result"  # MCP: a CallToolResult with isError, text `[code] message`
JSONRPC_INVALID_PARAMS = -32602  # MCP: a JSON-RPC error (the SDK's `INVALID_PARAMS`)

# The `corral` command's exit statuses (0 is success).
EXIT_FAILED = 1  # the definitions or the lock are wrong, or the work failed (`validate`, `lock --check`)
EXIT_USAGE = 2  # the command line, the settings or a request asked for something that cannot be done
EXIT_UNAVAILABLE = 3  # a server could not be reached or is busy: the same command may work later
EXIT_REFUSED = 4  # not allowed: a missing key, a foreign origin, a hook's or a person's refusal
EXIT_CANCELLED = 130  # stopped by Ctrl-C, as a shell reports SIGINT


class Forms(NamedTuple):
    """How one code is shown: HTTP status, MCP form (`TOOL_RESULT` or a JSON-RPC code), exit status."""

    http: int
    mcp: str | int
    exit: int


ERRORS: dict[str, Forms] = {
    # the client's request
    "invalid_request": Forms(400, TOOL_RESULT, EXIT_USAGE),
    "unauthorized": Forms(401, TOOL_RESULT, EXIT_REFUSED),
    "forbidden": Forms(403, TOOL_RESULT, EXIT_REFUSED),
    "not_found": Forms(404, JSONRPC_INVALID_PARAMS, EXIT_USAGE),  # MCP: an unknown tool, resource, prompt
    "agent_not_found": Forms(404, TOOL_RESULT, EXIT_USAGE),
    "digest_not_found": Forms(404, TOOL_RESULT, EXIT_USAGE),
    "conversation_not_found": Forms(404, TOOL_RESULT, EXIT_USAGE),
    "turn_not_found": Forms(404, TOOL_RESULT, EXIT_USAGE),
    "method_not_allowed": Forms(405, TOOL_RESULT, EXIT_USAGE),
    "request_timeout": Forms(408, TOOL_RESULT, EXIT_UNAVAILABLE),
    "conversation_busy": Forms(409, TOOL_RESULT, EXIT_UNAVAILABLE),
    "conflict": Forms(409, TOOL_RESULT, EXIT_USAGE),
    # the turn waits on a person (MCP, the OpenAI route): it goes on once someone answers
    "permission_required": Forms(409, TOOL_RESULT, EXIT_REFUSED),
    "payload_too_large": Forms(413, TOOL_RESULT, EXIT_USAGE),
    "unsupported_media_type": Forms(415, TOOL_RESULT, EXIT_USAGE),
    "host_not_allowed": Forms(421, TOOL_RESULT, EXIT_REFUSED),
    "idempotency_key_reused": Forms(422, TOOL_RESULT, EXIT_USAGE),
    # the definitions
    "definitions_invalid": Forms(422, TOOL_RESULT, EXIT_FAILED),
    "lock_mismatch": Forms(409, TOOL_RESULT, EXIT_FAILED),
    # an alias (or the lock) requires a passing eval run of a digest that has none (§12)
    "evals_required": Forms(409, TOOL_RESULT, EXIT_REFUSED),
    # a turn (and what `turn.failed` carries)
    "cancelled": Forms(409, TOOL_RESULT, EXIT_CANCELLED),
    "prompt_blocked": Forms(422, TOOL_RESULT, EXIT_REFUSED),
    "context_window_exceeded": Forms(422, TOOL_RESULT, EXIT_FAILED),
    "budget_exceeded": Forms(422, TOOL_RESULT, EXIT_FAILED),
    "max_steps_exceeded": Forms(500, TOOL_RESULT, EXIT_FAILED),
    "interrupted": Forms(500, TOOL_RESULT, EXIT_UNAVAILABLE),  # the server stopped during the turn
    "model_error": Forms(502, TOOL_RESULT, EXIT_FAILED),
    "tool_error": Forms(502, TOOL_RESULT, EXIT_FAILED),
    # 422, not 5xx: the model was asked to repair it already, and OpenAI's clients retry a 5xx (a paid turn)
    "output_invalid": Forms(422, TOOL_RESULT, EXIT_FAILED),
    "loop_detected": Forms(508, TOOL_RESULT, EXIT_FAILED),
    # the server
    "overloaded": Forms(503, TOOL_RESULT, EXIT_UNAVAILABLE),
    # A dead store exits 1: the process ends so that a supervisor restarts it, whatever the cause.
    "storage_error": Forms(503, TOOL_RESULT, EXIT_FAILED),
    "unreachable": Forms(502, TOOL_RESULT, EXIT_UNAVAILABLE),  # `corral chat --url`, `corral lock`
    "in_use": Forms(409, TOOL_RESULT, EXIT_UNAVAILABLE),  # `corral serve`: the state or the port is taken
    "internal": Forms(500, TOOL_RESULT, EXIT_FAILED),
}

# The codes a turn can end with (`turn.failed`, a failed result), besides the request's own.
TURN_FAILURES = ("model_error", "tool_error", "storage_error", "loop_detected", "max_steps_exceeded",
                 "prompt_blocked", "context_window_exceeded", "budget_exceeded", "output_invalid",
                 "interrupted", "internal")


def forms(code: str) -> Forms:
    """The table's row for `code`; a code the table lacks is shown as `internal` (a bug: see the tests)."""
    return ERRORS.get(code) or ERRORS["internal"]


def envelope(code: str, message: str, details: Any = None, request_id: str | None = None) -> dict[str, Any]:
    """`{"error": {"code", "message", "details"?, "request_id"?}}`: the one error body."""
    body: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        body["details"] = details
    if request_id:
        body["request_id"] = request_id
    return {"error": body}


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
        return forms(self.code).http

    @property
    def exit_status(self) -> int:
        return forms(self.code).exit

    def envelope(self, request_id: str | None = None) -> dict[str, Any]:
        return envelope(self.code, self.message, self.details, request_id)


class AuthorError(CorralError):
    """A mistake in the definition files."""


class RequestError(CorralError):
    """A client sent something we cannot act on."""

    code = "invalid_request"


class AgentNotFound(RequestError):
    code = "agent_not_found"


class DigestNotFound(RequestError):
    code = "digest_not_found"


class ConversationNotFound(RequestError):
    code = "conversation_not_found"


class TurnNotFound(RequestError):
    code = "turn_not_found"


class ConversationBusy(RequestError):
    code = "conversation_busy"


class IdempotencyKeyReused(RequestError):
    code = "idempotency_key_reused"


class DuplicateIdempotencyKey(RequestError):
    """`Store.create_turn`: the conversation already has a turn with this idempotency key.

    The run stage finds the first turn before it creates one, so this only
    escapes when two requests with one key race past that check: the loser is
    told so (409), not handed a 500.
    """

    code = "conflict"

    def __init__(self, key: str):
        super().__init__("a turn with this Idempotency-Key is already being created; retry for its result",
                         details={"idempotency_key": key})
        self.key = key


class PermissionNotFound(RequestError):
    code = "not_found"


class StateOwned(CorralError):
    """The embedded store is another live process's (`store.ownership`); `record` is what that process
    wrote of itself (`pid`, `command`, `url`; {} when unreadable)."""

    code = "in_use"

    def __init__(self, path: Path, record: dict[str, Any]):
        self.path, self.record = path, record
        url = self.url
        command = f"corral {record.get('command') or ''}".strip()
        what = f"serving {url}" if url else f"({command}, no URL)"
        super().__init__(f"the state in {path.parent} is owned by another process: pid "
                         f"{record.get('pid', 'unknown')}, {what}; stop it or use another CORRAL_STATE_DIR")

    @property
    def url(self) -> str | None:
        url = self.record.get("url")
        return url if isinstance(url, str) and url else None


class Overloaded(CorralError):
    """The server cannot take this request now: too many turns, shutting down, or the turn went on
    elsewhere. The same request may work shortly (503)."""

    code = "overloaded"


class TimedOut(Overloaded):
    """A bounded wait whose end reaches a client ran out: `what` did not happen within `seconds`.
    Retrying later is the answer, as for any overload; `details` say what was waited for and how long."""

    def __init__(self, what: str, seconds: float, **details: Any):
        super().__init__(f"{what} within {seconds:g} s; try again shortly",
                         details={**details, "waited_s": seconds})
        self.seconds = seconds


class RunError(CorralError):
    """A turn failed while running."""


class ModelError(RunError):
    code = "model_error"


class ProviderError(ModelError):
    """A failed model call; `retryable` for 429/5xx/time-outs/connection errors."""

    def __init__(self, message: str, *, retryable: bool = False, retry_after: float | None = None,
                 status: int | None = None):
        super().__init__(message, details={"status": status} if status else None)
        self.retryable = retryable
        self.retry_after = retry_after
        self.status = status


class ToolError(RunError):
    code = "tool_error"


class StorageError(RunError):
    """The store could not commit (or read) what a turn needed; the message names no path."""

    code = "storage_error"


class StoreUnreachable(StorageError):
    """The store could not be reached (the connection was lost or refused, the server restarting):
    the write did not commit (or, if the connection broke during its commit, the store cannot
    say), and the same write may succeed once it is back (a running turn retries it)."""


class LeaseLost(RunError):
    """A write of a turn whose fencing token is no longer the conversation's: its lease lapsed (the
    replica was paused or cut off) and another replica took the turn over. Nothing was written; the
    turn stops here without an ending, since it goes on elsewhere."""

    code = "interrupted"


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
