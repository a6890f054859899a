"""Bounded waits whose end reaches a client: a time-out is an answer, not a crash.

`anyio.fail_after` raises `TimeoutError`, which no route catches: left as it
is, a wait that runs out (a turn that does not stop when told to, a turn
another request started that does not show up) would be a 500 `internal`.
`waited` is the same bound, its end `TimedOut`: a 503 `overloaded` (retry
later) that says what did not happen.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio

from ..errors import TimedOut


@contextmanager
def waited(seconds: float, what: str, **details: Any) -> Iterator[None]:
    """`anyio.fail_after(seconds)`; running out is `TimedOut` saying `what`."""
    try:
        with anyio.fail_after(seconds):
            yield
    except TimeoutError:
        raise TimedOut(what, seconds, **details) from None
