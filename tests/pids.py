"""Waiting on processes and conditions in tests, always with a bound."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import anyio


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a killed process whose reaper is slow lingers as a zombie: that counts as gone
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


async def wait_until(condition: Callable[[], bool], bound: float = 5) -> None:
    with anyio.fail_after(bound):
        while not condition():
            await anyio.sleep(0.02)
