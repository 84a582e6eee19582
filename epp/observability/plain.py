"""Histograms as plain Python numbers, turned into Prometheus families (`families.py`) only when `/metrics` is scraped.

No Prometheus import here: the decision code (which may not import prometheus_client) keeps its own counts too.

prometheus_client's children take a lock per increment and its histogram walks the buckets in Python, several
microseconds per request on the serving loop; a `bisect` into a list of ints costs a tenth of that. Everything is
written on the serving loop; `/metrics` copies the numbers there (`families` builds new objects) and renders the
text in a worker thread, so no lock is needed and a slow scrape never holds the loop.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np


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

    def observe_all(self, values: Sequence[float] | np.ndarray) -> None:
        """`observe` each value in turn: the same buckets (`side="left"` is bisect_left's rule) and the same sum, the
        values added one after the other in their order (`accumulate` is sequential, unlike `sum`). For the batches
        of the request path's fold: at 256 values numpy costs a third of a bisect per value (break-even near 40)."""
        batch = (
            np.asarray(values, np.float64)
            if isinstance(values, np.ndarray)
            else np.fromiter(values, np.float64, len(values))
        )
        index = np.searchsorted(_as_array(self.bounds), batch, side="left")
        index[np.isnan(batch)] = 0  # bisect_left puts NaN first: no bound is below it
        for i, n in enumerate(np.bincount(index, minlength=len(self.counts)).tolist()):
            if n:
                self.counts[i] += n
        self.sum = float(np.add.accumulate(np.concatenate(((self.sum,), batch)))[-1])

    def add(self, other: PlainHistogram) -> None:
        for i, count in enumerate(other.counts):
            self.counts[i] += count
        self.sum += other.sum

    @property
    def count(self) -> int:
        return sum(self.counts)


class RecurringHistogram(PlainHistogram):
    """A `PlainHistogram` of values that recur (the prefix index's hit ratio and bytes: ratios of small block
    counts, whole blocks of bytes): each value's bucket, `bisect_left` as `observe`'s, remembered for the next time
    (a dict lookup, where the bisect costs ~700 instructions), for up to `memo` distinct values."""

    __slots__ = ("_buckets", "_memo")

    def __init__(self, bounds: Sequence[float], memo: int = 512) -> None:
        super().__init__(bounds)
        self._buckets: dict[float, int] = {}
        self._memo = memo

    def observe(self, value: float) -> None:
        bucket = self._buckets.get(value)
        if bucket is None:
            bucket = bisect.bisect_left(self.bounds, value)
            if len(self._buckets) < self._memo:
                self._buckets[value] = bucket
        self.counts[bucket] += 1
        self.sum += value


_ARRAYS: dict[tuple[float, ...], np.ndarray] = {}  # bounds → the same as a float array (a few dozen bucket sets)


def _as_array(bounds: Sequence[float]) -> np.ndarray:
    key = tuple(bounds)
    array = _ARRAYS.get(key)
    if array is None:
        array = _ARRAYS[key] = np.asarray(key, dtype=np.float64)
    return array
