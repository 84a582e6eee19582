"""Request metrics of serving workers, built into one exposition where `/metrics` is scraped.

Each worker counts its requests in its own `PickerMetrics`, as one process does. It does not render them: when
anything changed since its last message (and only then: an idle worker sends nothing), `DeltaSource.delta` gives
the series whose numbers moved, whole (cumulative, so a message is never added twice), and the per-process totals
(histograms without labels, stream counts, attempts and rewrites by bounded labels): a message bounded by the
worker's own label caps, not by what it ever saw.

The control process keeps each worker's latest series in a `SeriesFold`. The label caps are the picker's, there:
a worker's series key is mapped, once, through the control process's own `BoundedLabel`s (model, fairness id),
the client series' share of the page and the `MAX_SERIES` bound, so the picker as a whole shows at most the
names one process would show, and the rest under the same `other` value; names a worker already sent as `other`
stay `other`. On a scrape `state()` sums the workers' numbers by mapped key into one `MetricsState`, which
`PickerMetrics.families` renders exactly as in one process: the same names, labels and buckets.
"""

from __future__ import annotations

from dataclasses import dataclass

from epp.observability.labels import (
    CLIENT_SERIES_BYTES,
    FAIRNESS_LIMIT,
    MODEL_LIMIT,
    OVERFLOW,
    BoundedLabel,
    client_series_cost,
    without_client_values,
)
from epp.observability.metrics import DEFAULT_FAIRNESS_ID, MAX_SERIES, LabelSource, PickerMetrics
from epp.observability.request_series import MetricsState, Series

SeriesKey = tuple[str, str, str, str]  # (model, target model, fairness id, priority)

_TOTAL_HISTOGRAMS = ("scheduler", "request_processing", "response_processing", "stream_duration")


@dataclass(frozen=True, slots=True)
class SeriesDelta:
    """Worker → control: the series changed since the last delta (their cumulative numbers) and the totals (a
    `MetricsState` without series)."""

    series: dict[SeriesKey, Series]
    totals: MetricsState


def _signature(series: Series) -> tuple[int | float, ...]:
    """Changes whenever any number of the series does (every observation adds to some count)."""
    return (
        series.total,
        series.running,
        sum(series.errors.values()),
        *(sum(getattr(series, name).counts) for name in Series._HISTS),
    )


class DeltaSource:
    """Worker side: what changed in `metrics` since the last `delta()`, or None when nothing did."""

    def __init__(self, metrics: PickerMetrics) -> None:
        self._metrics = metrics
        self._activity = -1
        self._sent: dict[SeriesKey, tuple[int | float, ...]] = {}

    def delta(self) -> SeriesDelta | None:
        activity = self._metrics.activity
        if activity == self._activity:
            return None
        self._activity = activity
        state = self._metrics.folded()
        changed: dict[SeriesKey, Series] = {}
        sent = self._sent
        for key, series in state.series.items():
            signature = _signature(series)
            if sent.get(key) != signature:
                sent[key] = signature
                changed[key] = series.copy()
        return SeriesDelta(changed, state.copy(series=False))


def _bounded(label: BoundedLabel, value: str) -> str:
    return value if value == OVERFLOW else label(value)


def _add_series(into: Series, other: Series) -> None:
    into.total += other.total
    into.running += other.running
    for code, n in other.errors.items():
        into.errors[code] = into.errors.get(code, 0) + n
    for name in Series._HISTS:
        getattr(into, name).add(getattr(other, name))


class SeriesFold:
    """Control side: every worker's latest series and totals, under the picker's label caps, summed on scrape.

    `receive` and `forget` run on the control process's loop; `state` may run in the `/metrics` thread: it only
    reads (each worker's numbers are replaced whole, never changed in place)."""

    def __init__(self, labels: LabelSource | None = None) -> None:
        self._labels = labels
        self._labels_version = -1
        self.model_label = BoundedLabel(MODEL_LIMIT)
        self.fairness_label = BoundedLabel(FAIRNESS_LIMIT)
        self._keys: dict[SeriesKey, SeriesKey] = {}  # a worker's key → the picker's
        self._picker_keys: set[SeriesKey] = set()
        self._client_bytes = 0  # as PickerMetrics': the client series' estimated share of /metrics
        self._workers: dict[int, tuple[dict[SeriesKey, Series], MetricsState]] = {}

    def receive(self, worker: int, delta: SeriesDelta) -> None:
        source = self._labels
        if source is not None and source.version != self._labels_version:
            self._labels_version = source.version
            self.model_label.pin(source.configured_models())
        for key in delta.series:
            if key not in self._keys:
                self._keys[key] = self._admit(key)
        for _, target, _ in delta.totals.attempts:
            self._target(target)
        for model, target in delta.totals.rewrites:
            self._target(model)
            self._target(target)
        previous = self._workers.get(worker)
        series = {**previous[0], **delta.series} if previous is not None else dict(delta.series)
        self._workers[worker] = (series, delta.totals)

    def forget(self, worker: int) -> None:
        """The worker ended: its numbers go with it (a restarted worker counts from zero, as a restarted process)."""
        self._workers.pop(worker, None)

    def _target(self, name: str) -> str:
        return _bounded(self.model_label, name)

    def _admit(self, key: SeriesKey) -> SeriesKey:
        model, target, fairness, priority = key
        mapped = (self._target(model), self._target(target), _bounded(self.fairness_label, fairness), priority)
        if mapped not in self._picker_keys:
            cost = client_series_cost(self.model_label, mapped, DEFAULT_FAIRNESS_ID)
            if len(self._picker_keys) >= MAX_SERIES:
                mapped = (OVERFLOW, OVERFLOW, OVERFLOW, priority if len(priority) <= 11 else OVERFLOW)
            elif self._client_bytes + cost > CLIENT_SERIES_BYTES:
                mapped = without_client_values(self.model_label, mapped, DEFAULT_FAIRNESS_ID)
            else:
                self._client_bytes += cost
        self._picker_keys.add(mapped)
        return mapped

    def state(self) -> MetricsState:
        """The workers' numbers summed by the picker's labels: what one process would hold."""
        out = MetricsState()
        keys, target = self._keys, self._target_of
        for series, totals in list(self._workers.values()):
            for key, numbers in series.items():
                mapped = keys.get(key, key)
                into = out.series.get(mapped)
                if into is None:
                    into = out.series[mapped] = Series()
                _add_series(into, numbers)
            for outcome, n in totals.by_outcome.items():
                out.by_outcome[outcome] = out.by_outcome.get(outcome, 0) + n
            for name in _TOTAL_HISTOGRAMS:
                getattr(out, name).add(getattr(totals, name))
            for (status, model, address), n in totals.attempts.items():
                attempt = (status, target(model), address)
                out.attempts[attempt] = out.attempts.get(attempt, 0) + n
            for (model, rewritten), n in totals.rewrites.items():
                pair = (target(model), target(rewritten))
                out.rewrites[pair] = out.rewrites.get(pair, 0) + n
            out.streams_inflight += totals.streams_inflight
            for code, n in totals.streams.items():
                out.streams[code] = out.streams.get(code, 0) + n
        return out

    def _target_of(self, name: str) -> str:
        """A name already seen by `receive` (no admission here: this may run off the loop)."""
        if name == OVERFLOW or not name:
            return name
        label = self.model_label
        return name if name in label else OVERFLOW
