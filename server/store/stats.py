"""Counters of what a store sent to its database, for benchmarks (statements and transactions per turn)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StoreStats:
    statements: int = 0
    transactions: int = 0
