"""Prometheus metrics in text exposition format, with no dependency.

Counters and histograms keyed by label values; `render()` is `/metrics`.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


def _labels(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    if not names:
        return ""
    escaped = (v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for v in values)
    return "{" + ",".join(f'{n}="{v}"' for n, v in zip(names, escaped, strict=True)) + "}"


class Counter:
    def __init__(self, name: str, help_text: str, labels: tuple[str, ...] = ()):
        self.name, self.help, self.labels = name, help_text, labels
        self.values: dict[tuple[str, ...], float] = defaultdict(float)

    def inc(self, *values: str, amount: float = 1.0) -> None:
        self.values[values] += amount

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        lines += [f"{self.name}{_labels(self.labels, k)} {v:g}" for k, v in sorted(self.values.items())]
        return lines


class Gauge(Counter):
    def set(self, value: float, *values: str) -> None:
        self.values[values] = value

    def render(self) -> list[str]:
        lines = super().render()
        lines[1] = f"# TYPE {self.name} gauge"
        if not self.values and not self.labels:
            lines.append(f"{self.name} 0")
        return lines


class Histogram:
    def __init__(self, name: str, help_text: str, labels: tuple[str, ...] = (),
                 buckets: tuple[float, ...] = DURATION_BUCKETS):
        self.name, self.help, self.labels, self.buckets = name, help_text, labels, buckets
        self.counts: dict[tuple[str, ...], list[int]] = {}
        self.sums: dict[tuple[str, ...], float] = defaultdict(float)

    def observe(self, value: float, *values: str) -> None:
        counts = self.counts.setdefault(values, [0] * (len(self.buckets) + 1))
        counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sums[values] += value

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for key, counts in sorted(self.counts.items()):
            running = 0
            for bound, count in zip((*self.buckets, float("inf")), counts, strict=True):
                running += count
                le = "+Inf" if bound == float("inf") else f"{bound:g}"
                lines.append(f"{self.name}_bucket{_labels((*self.labels, 'le'), (*key, le))} {running}")
            lines.append(f"{self.name}_sum{_labels(self.labels, key)} {self.sums[key]:g}")
            lines.append(f"{self.name}_count{_labels(self.labels, key)} {running}")
        return lines


class Metrics:
    """Every metric Corral exports; one instance per server."""

    def __init__(self) -> None:
        self.turns = Counter("corral_turns_total", "Turns ended, by agent and outcome.", ("agent", "outcome"))
        self.turn_duration = Histogram("corral_turn_duration_seconds", "Turn wall time.", ("agent",))
        self.model_requests = Counter("corral_model_requests_total", "Model steps, by provider and outcome.",
                                      ("provider", "outcome"))
        self.tool_calls = Counter("corral_tool_calls_total", "Tool calls, by tool and outcome.",
                                  ("tool", "outcome"))
        self.swaps = Counter("corral_swaps_total", "Definition swaps, by status.", ("status",))
        self.busy = Gauge("corral_busy_conversations", "Conversations with a turn in progress.")
        self.streams = Gauge("corral_active_streams", "Open SSE streams.")
        # replicas: what this one sees of the others (all of them share the store)
        self.replicas = Gauge("corral_replicas", "Replicas with a heartbeat within a lease, as last seen.")
        self.recovered = Counter("corral_turns_recovered_total",
                                 "Turns of a replica whose lease lapsed, ended here as interrupted.")
        self.notices = Counter("corral_notices_total", "Notices received from other replicas, by kind.",
                               ("kind",))
        self.all = (self.turns, self.turn_duration, self.model_requests, self.tool_calls,
                    self.swaps, self.busy, self.streams, self.replicas, self.recovered, self.notices)

    def render(self) -> str:
        return "\n".join(line for metric in self.all for line in metric.render()) + "\n"
