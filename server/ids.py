"""Identifiers: a prefix and a ULID, so ids sort by creation time.

`conv_01J9Z3...`: the ULID is 26 Crockford base32 characters encoding a 48-bit
millisecond timestamp and 80 random bits. Within one millisecond (or if the
clock steps back) this process increments the random part instead of drawing
it again, so ids from one process are strictly increasing. They are unique
names, not secrets: the increment makes neighbours guessable.
"""

from __future__ import annotations

import os
import secrets
import threading
import time

ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford: ascending in ASCII, so text order is numeric order
_RANDOM_BITS = 80


class _Monotonic:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ms = -1
        self._random = 0

    def next(self) -> int:
        with self._lock:
            ms = time.time_ns() // 1_000_000
            if ms > self._ms:
                random = secrets.randbits(_RANDOM_BITS)
            else:
                ms, random = self._ms, self._random + 1
                if random >> _RANDOM_BITS:  # the random part started near 2**80: borrow the next millisecond
                    ms, random = ms + 1, 0
            self._ms, self._random = ms, random
            return (ms << _RANDOM_BITS) | random

    def forget(self) -> None:
        self._lock = threading.Lock()
        self._ms = -1


_monotonic = _Monotonic()
_next = _monotonic.next
# a forked child draws fresh random bits: counting on from the parent's state would repeat its ids
os.register_at_fork(after_in_child=_monotonic.forget)


def encode(value: int) -> str:
    """A 128-bit value as 26 Crockford base32 characters."""
    chars = []
    for _ in range(26):
        chars.append(ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def new_id(prefix: str) -> str:
    """`prefix` + "_" + a monotonic ULID."""
    return f"{prefix}_{encode(_next())}"
