"""Histograms as plain Python numbers, turned into Prometheus families (`families.py`) only when `/metrics` is scraped.

No Prometheus import here: the decision code (which may not import prometheus_client) keeps its own counts too.

prometheus_client's children take a lock per increment and its histogram walks the buckets in Python, several
microseconds per request on the serving loop; a `bisect` into a list of ints costs a tenth of that. Everything is
written on the serving loop; `/metrics` copies the numbers there (`families` builds new objects) and renders the
text in a worker thread, so no lock is needed and a slow scrape never holds the loop.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence


class PlainHistogram:
    """Counts per bucket (not cumulative; the last is +Inf) and the sum; `observe` is one bisect."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # le: a value on a bound is in that bucket
        self.sum += value

    def observe_all(self, values: Iterable[float]) -> None:
        """`observe` each value in turn (the same counts and the same sum, added in the same order)."""
        counts, bounds, total = self.counts, self.bounds, self.sum
        for value in values:
            counts[bisect.bisect_left(bounds, value)] += 1
            total += value
        self.sum = total

    def add(self, other: PlainHistogram) -> None:
        for i, count in enumerate(other.counts):
            self.counts[i] += count
        self.sum += other.sum

    @property
    def count(self) -> int:
        return sum(self.counts)
