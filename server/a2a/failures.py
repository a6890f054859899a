"""Corral's errors in A2A's words: A2A's own error where it names one, else the error table's code.

An unknown (or another agent's) task is `TaskNotFoundError`; cancelling one
that ended, `TaskNotCancelableError`. Any other `CorralError` becomes
JSON-RPC "invalid params" (a client's mistake: the table's 4xx) or "internal
error" (5xx), its data's `ErrorInfo` metadata carrying the table's `code`,
the message and the details (as JSON), so a client reads the same code the
HTTP routes answer.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
from collections.abc import Callable
from typing import Any

from a2a.utils.errors import A2AError, InternalError, InvalidParamsError, TaskNotFoundError

from ..errors import CorralError

log = logging.getLogger("corral.a2a")


def translated(exc: CorralError) -> A2AError:
    data: dict[str, Any] = {"code": exc.code, "message": exc.message}
    if exc.details is not None:
        data["details"] = json.dumps(exc.details, ensure_ascii=False, default=str)
    if exc.code in ("turn_not_found",):
        return TaskNotFoundError(exc.message, data=data)
    if 400 <= exc.http_status < 500:
        return InvalidParamsError(exc.message, data=data)
    return InternalError(exc.message, data=data)


def speaks_a2a(method: Callable) -> Callable:
    """A handler method (coroutine or async generator) whose `CorralError`s leave as A2A errors."""
    if inspect.isasyncgenfunction(method):
        @functools.wraps(method)
        async def stream(*args: Any, **kwargs: Any) -> Any:
            inner = method(*args, **kwargs)
            try:
                async for item in inner:
                    yield item
            except CorralError as exc:
                raise translated(exc) from exc
            finally:  # a client that went away closes the stream: so is the generator it reads
                await inner.aclose()
        return stream

    @functools.wraps(method)
    async def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return await method(*args, **kwargs)
        except CorralError as exc:
            raise translated(exc) from exc
    return call
