"""Waiting on processes and conditions in tests, always with a bound."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import anyio


def alive(pid: int) -> bool:
    """Whether `pid` is a running process (a zombie, killed but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


async def wait_until(condition: Callable[[], object], bound: float = 5) -> None:
    """Return once `condition()` is true; fail after `bound` seconds."""
    with anyio.fail_after(bound):
        while not condition():
            await anyio.sleep(0.02)
